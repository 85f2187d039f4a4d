//! The coordinator's kept state: with `state_dir` set, everything a
//! restarted coordinator needs to serve what it served before, in an
//! embedded store (redb: one file, ACID transactions with copy-on-write
//! B-trees, so a `kill -9` mid-write leaves the last committed state; pure
//! Rust, no C library to build):
//!
//! - `meta`: the epoch (one more at every start) and the next free id
//!   (networks and deployments; reserved in blocks, so ids never repeat);
//! - `networks`: each loaded network ([`NetworkRecord`]): its load
//!   request, where its model is, the tensors' types the workers reported,
//!   and every copy's deployment with its plan;
//! - `models`: the model repository's entries ([`ModelRecord`]).
//!
//! Model bytes a client sent are files under `blobs/`, named by their
//! sha-256 (written once, then renamed: never half a file); a named model
//! read from a file is kept by path and hash. Without `state_dir`, nothing
//! is kept. Restoring is [`restore`].

mod records;
pub mod restore;
mod store;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sha2::{Digest, Sha256};

pub use records::{DeployedRecord, ModelRecord, ModelRef, NetworkRecord, ReplicaRecord};
pub use store::{Store, StoreError};

use crate::network::Loaded;
use crate::Shared;

/// Ids are reserved in the store this many at a time.
const ID_BLOCK: u64 = 1000;

/// The sha-256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The state store as the coordinator uses it: ids, the epoch, and writes
/// in the order they are asked (one at a time, each a committed
/// transaction, off the async threads). Failed writes are logged: the
/// coordinator goes on serving what it has.
pub struct Keeper {
    store: Option<Arc<Store>>,
    /// The coordinator's epoch: one more at every start with this state.
    epoch: u64,
    next: AtomicU64,
    /// Ids below this are reserved in the store.
    reserved: AtomicU64,
    /// Writes one at a time, in order.
    order: tokio::sync::Mutex<()>,
    /// Networks removed in this run (ids never repeat): a save that comes
    /// after, from a re-plan that raced the unload, is dropped.
    removed: std::sync::Mutex<std::collections::HashSet<u64>>,
}

impl Keeper {
    /// Nothing kept: epoch 1, ids from 1.
    pub fn none() -> Keeper {
        Keeper {
            store: None,
            epoch: 1,
            next: AtomicU64::new(1),
            reserved: AtomicU64::new(u64::MAX),
            order: tokio::sync::Mutex::new(()),
            removed: Default::default(),
        }
    }

    /// Opens (or makes) the state in `dir`; an empty path keeps nothing.
    /// Starts a new epoch.
    pub fn open(dir: &Path) -> Result<Keeper, StoreError> {
        if dir.as_os_str().is_empty() {
            return Ok(Keeper::none());
        }
        let store = Store::open(dir)?;
        let epoch = store.start_epoch()?;
        let next = store.reserved_ids()?.max(1);
        tracing::info!(dir = %dir.display(), epoch, "state kept in the state directory");
        Ok(Keeper {
            store: Some(Arc::new(store)),
            epoch,
            next: AtomicU64::new(next),
            reserved: AtomicU64::new(next),
            order: tokio::sync::Mutex::new(()),
            removed: Default::default(),
        })
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether anything is kept.
    pub fn keeps(&self) -> bool {
        self.store.is_some()
    }

    /// A fresh id (a network's or a deployment's), never given before with
    /// this state.
    pub async fn next_id(&self) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if id < self.reserved.load(Ordering::Relaxed) {
            return id;
        }
        let _one = self.order.lock().await;
        if id >= self.reserved.load(Ordering::Relaxed) {
            let upto = id + ID_BLOCK;
            self.write("reserving ids", move |s| s.reserve_ids(upto))
                .await;
            self.reserved.store(upto, Ordering::Relaxed);
        }
        id
    }

    /// Runs `op` on the store off the async threads; logs a failure.
    async fn write(
        &self,
        what: &str,
        op: impl FnOnce(&Store) -> Result<(), StoreError> + Send + 'static,
    ) {
        let Some(store) = self.store.clone() else {
            return;
        };
        match tokio::task::spawn_blocking(move || op(&store)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!("state store, {what}: {e}"),
            Err(e) => tracing::error!("state store, {what}: {e}"),
        }
    }

    /// Keeps `loaded` as it is now (its copies' deployments).
    pub async fn save_network(&self, loaded: &Arc<Loaded>) {
        if !self.keeps() {
            return;
        }
        let _one = self.order.lock().await;
        if self.was_removed(loaded.id) {
            return;
        }
        let loaded = loaded.clone();
        self.write("saving a network", move |store| {
            let record = NetworkRecord::of(&loaded);
            if let ModelRef::Blob { sha256 } = &record.model {
                store.put_blob(sha256, &loaded.model)?;
            }
            store.put_network(&record)
        })
        .await;
    }

    fn was_removed(&self, id: u64) -> bool {
        self.removed.lock().is_ok_and(|r| r.contains(&id))
    }

    /// Forgets network `id`.
    pub async fn remove_network(&self, id: u64) {
        if !self.keeps() {
            return;
        }
        let _one = self.order.lock().await;
        if let Ok(mut removed) = self.removed.lock() {
            removed.insert(id);
        }
        self.write("removing a network", move |store| {
            store.remove_network(id)?;
            store.collect_blobs()
        })
        .await;
    }

    /// Keeps the model repository's entries as they are now.
    pub async fn save_models(&self, records: Vec<(ModelRecord, Option<bytes::Bytes>)>) {
        if !self.keeps() {
            return;
        }
        let _one = self.order.lock().await;
        self.write("saving the model repository", move |store| {
            for (record, bytes) in &records {
                if let (ModelRef::Blob { sha256 }, Some(bytes)) = (&record.source, bytes) {
                    store.put_blob(sha256, bytes)?;
                }
            }
            let records: Vec<ModelRecord> = records.into_iter().map(|(r, _)| r).collect();
            store.put_models(&records)?;
            store.collect_blobs()
        })
        .await;
    }

    /// What the store holds (nothing without a store).
    pub fn load(&self) -> Result<(Vec<NetworkRecord>, Vec<ModelRecord>), StoreError> {
        match &self.store {
            Some(s) => Ok((s.networks()?, s.models()?)),
            None => Ok((Vec::new(), Vec::new())),
        }
    }

    /// The bytes of blob `sha256`.
    pub fn blob(&self, sha256: &str) -> Result<bytes::Bytes, StoreError> {
        match &self.store {
            Some(s) => s.blob(sha256),
            None => Err(StoreError::NoBlob(sha256.to_string())),
        }
    }
}

/// Keeps the model repository's entries (with the bytes of those a client
/// sent) as they are now.
pub async fn save_models(shared: &Arc<Shared>) {
    if !shared.state.keeps() {
        return;
    }
    let records = shared.repository.records();
    let records = tokio::task::spawn_blocking(move || {
        records
            .into_iter()
            .map(|(name, source, request, wanted, network)| {
                ModelRecord::of(name, &source, request, wanted, network)
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    shared.state.save_models(records).await;
}
