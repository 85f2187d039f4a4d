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
//!
//! With `[ha]`, the same records are etcd keys ([`EtcdStore`]) that only
//! the leader writes, fenced by its epoch, and the blobs are in
//! `state_dir`, a volume every coordinator mounts.

mod blobs;
mod etcd;
pub mod lacking;
mod records;
pub mod restore;
mod store;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use etcd::{EtcdStore, Fence};
pub use records::{DeployedRecord, ModelRecord, ModelRef, NetworkRecord, ReplicaRecord};
pub use store::{Store, StoreError};

use crate::network::Loaded;
use crate::Shared;

/// Ids are reserved in the store this many at a time.
const ID_BLOCK: u64 = 1000;

pub use tessera_common::wire::pieces::sha256_hex;

/// A change to the kept state.
pub enum Change {
    /// Every id below this is reserved.
    ReserveIds(u64),
    /// A network as it is now, with its model's bytes when it names a blob.
    PutNetwork(Box<NetworkRecord>, Option<bytes::Bytes>),
    RemoveNetwork(u64),
    /// The model repository's entries (replacing all), with the bytes of
    /// those a client sent.
    PutModels(Vec<(ModelRecord, Option<bytes::Bytes>)>),
}

/// Where the state is kept.
enum Backend {
    None,
    /// One coordinator: `state_dir/state.redb`.
    Redb(Arc<Store>),
    /// HA: etcd, and model bytes in `state_dir` (each coordinator's own,
    /// or shared).
    Etcd(Arc<EtcdStore>),
}

/// The state store as the coordinator uses it: ids, the epoch, and writes
/// in the order they are asked (one at a time, each a committed
/// transaction, off the async threads). Failed writes are logged: the
/// coordinator goes on serving what it has; a write etcd refused because
/// this coordinator no longer leads is reported on [`Keeper::fenced`].
pub struct Keeper {
    backend: Backend,
    /// The coordinator's epoch: one more at every start with an embedded
    /// store; with etcd, the revision its lead began at.
    epoch: AtomicU64,
    next: AtomicU64,
    /// Ids below this are reserved in the store.
    reserved: AtomicU64,
    /// Writes one at a time, in order.
    order: tokio::sync::Mutex<()>,
    /// Networks removed in this run (ids never repeat): a save that comes
    /// after, from a re-plan that raced the unload, is dropped.
    removed: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// Set when etcd refused a write: this coordinator no longer leads.
    fenced: tokio::sync::watch::Sender<bool>,
}

impl Keeper {
    fn with(backend: Backend, epoch: u64, next: u64, reserved: u64) -> Keeper {
        Keeper {
            backend,
            epoch: AtomicU64::new(epoch),
            next: AtomicU64::new(next),
            reserved: AtomicU64::new(reserved),
            order: tokio::sync::Mutex::new(()),
            removed: Default::default(),
            fenced: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Nothing kept: epoch 1, ids from 1.
    pub fn none() -> Keeper {
        Keeper::with(Backend::None, 1, 1, u64::MAX)
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
        Ok(Keeper::with(
            Backend::Redb(Arc::new(store)),
            epoch,
            next,
            next,
        ))
    }

    /// The state in etcd (blobs in `dir/blobs`), for a standby: epoch 0
    /// and no ids until it leads ([`Keeper::lead`]).
    pub fn etcd(
        client: etcd_client::Client,
        prefix: &str,
        dir: &Path,
    ) -> Result<Keeper, StoreError> {
        let store = EtcdStore::new(client, prefix, blobs::Blobs::open(dir)?);
        Ok(Keeper::with(Backend::Etcd(Arc::new(store)), 0, 0, 0))
    }

    /// This coordinator leads from now on with `fence` (etcd): its epoch,
    /// and ids from the first one not reserved.
    pub async fn lead(&self, fence: Fence) -> Result<(), StoreError> {
        let Backend::Etcd(store) = &self.backend else {
            return Ok(());
        };
        let next = store.reserved_ids().await?.max(1);
        self.epoch.store(fence.epoch, Ordering::Relaxed);
        store.lead(fence);
        self.next.store(next, Ordering::Relaxed);
        self.reserved.store(next, Ordering::Relaxed);
        Ok(())
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Whether anything is kept.
    pub fn keeps(&self) -> bool {
        !matches!(self.backend, Backend::None)
    }

    /// Turns true once etcd refused a write (this coordinator no longer
    /// leads).
    pub fn fenced(&self) -> tokio::sync::watch::Receiver<bool> {
        self.fenced.subscribe()
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
            self.apply("reserving ids", Change::ReserveIds(upto)).await;
            self.reserved.store(upto, Ordering::Relaxed);
        }
        id
    }

    /// Makes `change` in the store (off the async threads); logs a failure.
    async fn apply(&self, what: &str, change: Change) {
        let done = match &self.backend {
            Backend::None => return,
            Backend::Redb(store) => {
                let store = store.clone();
                tokio::task::spawn_blocking(move || store.apply(change))
                    .await
                    .unwrap_or_else(|source| {
                        Err(StoreError::Task {
                            what: "applying a change",
                            source,
                        })
                    })
            }
            Backend::Etcd(store) => store.apply(change).await,
        };
        match done {
            Ok(()) => {}
            Err(e @ StoreError::Fenced(_)) => {
                tracing::error!("state store, {what}: {e}");
                self.fenced.send_replace(true);
            }
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
        let of = loaded.clone();
        let Ok(record) = tokio::task::spawn_blocking(move || NetworkRecord::of(&of)).await else {
            return;
        };
        let bytes = record.model.blob().and_then(|_| loaded.model());
        let change = Change::PutNetwork(Box::new(record), bytes);
        self.apply("saving a network", change).await;
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
        self.apply("removing a network", Change::RemoveNetwork(id))
            .await;
    }

    /// Keeps the model repository's entries as they are now.
    pub async fn save_models(&self, records: Vec<(ModelRecord, Option<bytes::Bytes>)>) {
        if !self.keeps() {
            return;
        }
        let _one = self.order.lock().await;
        self.apply("saving the model repository", Change::PutModels(records))
            .await;
    }

    /// What the store holds (nothing without a store).
    pub async fn load(&self) -> Result<(Vec<NetworkRecord>, Vec<ModelRecord>), StoreError> {
        match &self.backend {
            Backend::None => Ok((Vec::new(), Vec::new())),
            Backend::Redb(store) => {
                let store = store.clone();
                tokio::task::spawn_blocking(move || Ok((store.networks()?, store.models()?)))
                    .await
                    .unwrap_or_else(|source| {
                        Err(StoreError::Task {
                            what: "loading",
                            source,
                        })
                    })
            }
            Backend::Etcd(store) => store.load().await,
        }
    }

    /// The revision of the last change to the kept state (etcd only).
    pub async fn changed_at(&self) -> Option<i64> {
        match &self.backend {
            Backend::Etcd(store) => store.changed_at().await.ok(),
            _ => None,
        }
    }

    /// The bytes of blob `sha256` (blocking).
    pub fn blob(&self, sha256: &str) -> Result<bytes::Bytes, StoreError> {
        match &self.backend {
            Backend::None => Err(StoreError::NoBlob(sha256.to_string())),
            Backend::Redb(store) => store.blob(sha256),
            Backend::Etcd(store) => store.blobs().get(sha256),
        }
    }

    /// Keeps model bytes another coordinator sent (HA: in this one's own
    /// `blobs/`). Blocking.
    pub fn keep_blob(&self, sha256: &str, bytes: &[u8]) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Etcd(store) => store.blobs().put(sha256, bytes),
            Backend::None | Backend::Redb(_) => Ok(()),
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
