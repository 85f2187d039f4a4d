//! The kept state in etcd (HA): the same JSON records as the embedded
//! store, one key each under `PREFIX/state/`:
//!
//! - `meta/next_id`: the first id not reserved;
//! - `networks/<id, 20 digits>`: a [`NetworkRecord`];
//! - `models/<name>`: a [`ModelRecord`].
//!
//! A value over [`INLINE_LIMIT`] (a generative network's tokenizer, a big
//! plan) is kept in etcd too, as chunks of at most [`CHUNK`] bytes under
//! `chunks/<sha256>/<index>`, each written in a transaction of its own
//! (etcd refuses requests over 1.5 MiB by default) before the key that
//! holds `{"blob": sha256}`: a standby with a `state_dir` of its own (no
//! shared volume) reads every record. (Pointers of earlier versions,
//! whose bytes are in the `blobs/` folder, are still read there.) Model
//! bytes clients sent stay in `state_dir`'s `blobs/`.
//!
//! Every write is one transaction that holds only while this
//! coordinator's candidacy key still has the creation revision it led
//! with (its epoch): a coordinator that lost its lead, say paused past its
//! lease, writes nothing.

use std::collections::BTreeSet;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};

use super::blobs::Blobs;
use super::records::{ModelRecord, NetworkRecord};
use super::store::{json, parse};
use super::{sha256_hex, Change, StoreError};

/// Values longer than this are kept as chunks.
pub const INLINE_LIMIT: usize = 512 << 10;

/// The most bytes of one chunk of a large value.
pub const CHUNK: usize = 512 << 10;

/// How long one etcd request of the store may take.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `request`, failed as [`StoreError::Etcd`] past [`REQUEST_TIMEOUT`].
async fn timed<T>(
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StoreError> {
    crate::ha::within(REQUEST_TIMEOUT, request)
        .await
        .map_err(StoreError::Etcd)
}

/// A blocking task of the store (`what` it did) that failed.
fn task(what: &'static str) -> impl FnOnce(tokio::task::JoinError) -> StoreError {
    move |source| StoreError::Task { what, source }
}

/// Where this coordinator's writes hold: its candidacy key and the
/// creation revision it leads with.
#[derive(Debug, Clone)]
pub struct Fence {
    pub key: Vec<u8>,
    pub epoch: u64,
}

/// The state under `prefix/state/` in etcd, and the shared blobs.
pub struct EtcdStore {
    client: Client,
    prefix: String,
    blobs: Blobs,
    fence: std::sync::Mutex<Option<Fence>>,
}

/// A value as kept: the record's JSON, or where it is.
#[derive(serde::Serialize, serde::Deserialize)]
struct Pointer {
    blob: String,
}

impl EtcdStore {
    pub fn new(client: Client, prefix: &str, blobs: Blobs) -> EtcdStore {
        EtcdStore {
            client,
            prefix: format!("{}/state/", prefix.trim_end_matches('/')),
            blobs,
            fence: std::sync::Mutex::new(None),
        }
    }

    pub fn blobs(&self) -> &Blobs {
        &self.blobs
    }

    /// From now on, writes hold only while `fence` does.
    pub fn lead(&self, fence: Fence) {
        if let Ok(mut f) = self.fence.lock() {
            *f = Some(fence);
        }
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    fn network_key(&self, id: u64) -> String {
        self.key(&format!("networks/{id:020}"))
    }

    /// The first id not reserved yet.
    pub async fn reserved_ids(&self) -> Result<u64, StoreError> {
        let mut client = self.client.clone();
        let got = timed(client.get(self.key("meta/next_id"), None)).await?;
        match got.kvs().first() {
            Some(kv) => parse("meta/next_id", kv.value()),
            None => Ok(0),
        }
    }

    /// Makes `change` in one fenced transaction (blobs first).
    pub async fn apply(&self, change: Change) -> Result<(), StoreError> {
        let collect = matches!(change, Change::RemoveNetwork(_) | Change::PutModels(_));
        let ops = match change {
            Change::ReserveIds(upto) => vec![self.put("meta/next_id".into(), &upto).await?],
            Change::PutNetwork(record, bytes) => {
                self.put_blob(record.model.blob(), bytes).await?;
                let key = format!("networks/{:020}", record.id);
                vec![self.put(key, &record).await?]
            }
            Change::RemoveNetwork(id) => vec![TxnOp::delete(self.network_key(id), None)],
            Change::PutModels(records) => self.model_ops(records).await?,
        };
        self.commit(ops).await?;
        if collect {
            self.collect_blobs().await?;
        }
        Ok(())
    }

    /// Puts every model record and deletes the others (one txn may not
    /// both delete a range and put a key in it).
    async fn model_ops(
        &self,
        records: Vec<(ModelRecord, Option<bytes::Bytes>)>,
    ) -> Result<Vec<TxnOp>, StoreError> {
        let mut ops = Vec::new();
        let mut names = BTreeSet::new();
        for (record, bytes) in records {
            self.put_blob(record.source.blob(), bytes).await?;
            names.insert(self.key(&format!("models/{}", record.name)));
            ops.push(self.put(format!("models/{}", record.name), &record).await?);
        }
        for (key, _) in self.list("models/").await? {
            if !names.contains(&key) {
                ops.push(TxnOp::delete(key, None));
            }
        }
        Ok(ops)
    }

    async fn put_blob(
        &self,
        sha256: Option<&str>,
        bytes: Option<bytes::Bytes>,
    ) -> Result<(), StoreError> {
        let (Some(sha256), Some(bytes)) = (sha256, bytes) else {
            return Ok(());
        };
        let (blobs, sha256) = (self.blobs.clone(), sha256.to_string());
        tokio::task::spawn_blocking(move || blobs.put(&sha256, &bytes))
            .await
            .map_err(task("writing a blob"))?
    }

    /// A put of `value` at `rest`: inline, or as chunks (written now) and
    /// its pointer.
    async fn put<T: serde::Serialize>(&self, rest: String, value: &T) -> Result<TxnOp, StoreError> {
        let mut bytes = json(&rest, value)?;
        if bytes.len() > INLINE_LIMIT {
            let sha256 = sha256_hex(&bytes);
            self.put_chunks(&sha256, &bytes).await?;
            bytes = json(&rest, &Pointer { blob: sha256 })?;
        }
        Ok(TxnOp::put(self.key(&rest), bytes, None))
    }

    fn chunk_prefix(&self, sha256: &str) -> String {
        self.key(&format!("chunks/{sha256}/"))
    }

    /// Writes `bytes` as chunks under their hash, one fenced transaction
    /// each, unless they are all there.
    async fn put_chunks(&self, sha256: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let count = bytes.len().div_ceil(CHUNK);
        let mut client = self.client.clone();
        let options = GetOptions::new().with_prefix().with_count_only();
        let there = timed(client.get(self.chunk_prefix(sha256), Some(options))).await?;
        if there.count() == count as i64 {
            return Ok(());
        }
        for (i, chunk) in bytes.chunks(CHUNK).enumerate() {
            let key = format!("{}{i:06}", self.chunk_prefix(sha256));
            self.commit(vec![TxnOp::put(key, chunk.to_vec(), None)])
                .await?;
        }
        Ok(())
    }

    /// A large value's bytes: its chunks in etcd (checked against its
    /// hash), else the `blobs/` folder of earlier versions.
    async fn large_value(&self, sha256: &str) -> Result<Vec<u8>, StoreError> {
        let mut client = self.client.clone();
        let options = GetOptions::new().with_prefix();
        let got = timed(client.get(self.chunk_prefix(sha256), Some(options))).await?;
        let mut chunks: Vec<(&[u8], &[u8])> =
            got.kvs().iter().map(|kv| (kv.key(), kv.value())).collect();
        if !chunks.is_empty() {
            chunks.sort();
            let bytes: Vec<u8> = chunks.iter().flat_map(|(_, v)| v.iter().copied()).collect();
            if sha256_hex(&bytes) == sha256 {
                return Ok(bytes);
            }
            return Err(StoreError::BadChunks(sha256.to_string()));
        }
        let (blobs, sha) = (self.blobs.clone(), sha256.to_string());
        Ok(tokio::task::spawn_blocking(move || blobs.get(&sha))
            .await
            .map_err(task("reading a blob"))??
            .to_vec())
    }

    async fn commit(&self, ops: Vec<TxnOp>) -> Result<(), StoreError> {
        let fence = self.fence.lock().ok().and_then(|f| f.clone());
        let Some(fence) = fence else {
            return Err(StoreError::Fenced(0));
        };
        let when = Compare::create_revision(fence.key, CompareOp::Equal, fence.epoch as i64);
        let txn = Txn::new().when([when]).and_then(ops);
        let mut client = self.client.clone();
        let done = timed(client.txn(txn)).await?;
        if done.succeeded() {
            Ok(())
        } else {
            Err(StoreError::Fenced(fence.epoch))
        }
    }

    /// Every (key, value) under `rest`, values read back from their blobs.
    async fn list(&self, rest: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut client = self.client.clone();
        let options = GetOptions::new().with_prefix();
        let got = timed(client.get(self.key(rest), Some(options))).await?;
        let mut all = Vec::new();
        for kv in got.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            all.push((key, kv.value().to_vec()));
        }
        Ok(all)
    }

    /// The records under `rest`, and the blobs their pointers name.
    async fn records<T: serde::de::DeserializeOwned>(
        &self,
        rest: &str,
    ) -> Result<(Vec<T>, Vec<String>), StoreError> {
        let mut records = Vec::new();
        let mut pointed = Vec::new();
        for (key, value) in self.list(rest).await? {
            let value = match serde_json::from_slice::<Pointer>(&value) {
                Ok(p) => {
                    let read = self.large_value(&p.blob).await;
                    pointed.push(p.blob);
                    match read {
                        Ok(bytes) => bytes,
                        // One record this coordinator cannot read leaves
                        // the others kept (and it in etcd).
                        Err(e @ StoreError::NoBlob(_)) => {
                            tracing::warn!("the kept record {key} cannot be read: {e}");
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
                Err(_) => value,
            };
            records.push(parse(&key, &value)?);
        }
        Ok((records, pointed))
    }

    /// The revision of the last change under `prefix/state/` (a removal
    /// shows as fewer keys: the count goes in too).
    pub async fn changed_at(&self) -> Result<i64, StoreError> {
        let mut client = self.client.clone();
        let options = GetOptions::new().with_prefix().with_keys_only();
        let got = timed(client.get(self.key(""), Some(options))).await?;
        let newest = got.kvs().iter().map(|kv| kv.mod_revision()).max();
        Ok(newest.unwrap_or(0) * 1_000_000 + got.kvs().len() as i64)
    }

    /// Every kept network and model record.
    pub async fn load(&self) -> Result<(Vec<NetworkRecord>, Vec<ModelRecord>), StoreError> {
        let (networks, _) = self.records("networks/").await?;
        let (models, _) = self.records("models/").await?;
        Ok((networks, models))
    }

    /// Deletes the blobs no record or pointer names.
    async fn collect_blobs(&self) -> Result<(), StoreError> {
        let (networks, mut named) = self.records::<NetworkRecord>("networks/").await?;
        let (models, pointed) = self.records::<ModelRecord>("models/").await?;
        named.extend(pointed);
        let mut named: BTreeSet<String> = named.into_iter().collect();
        named.extend(
            networks
                .iter()
                .filter_map(|n| n.model.kept_as().map(String::from)),
        );
        named.extend(
            models
                .iter()
                .filter_map(|m| m.source.blob().map(String::from)),
        );
        self.collect_chunks(&named).await?;
        let blobs = self.blobs.clone();
        tokio::task::spawn_blocking(move || blobs.collect(&named))
            .await
            .map_err(task("collecting blobs"))?
    }

    /// Deletes the chunks of values no pointer names.
    async fn collect_chunks(&self, named: &BTreeSet<String>) -> Result<(), StoreError> {
        let mut client = self.client.clone();
        let options = GetOptions::new().with_prefix().with_keys_only();
        let got = timed(client.get(self.key("chunks/"), Some(options))).await?;
        let base = self.key("chunks/");
        let unnamed: BTreeSet<String> = got
            .kvs()
            .iter()
            .filter_map(|kv| {
                let key = String::from_utf8_lossy(kv.key());
                let sha = key.strip_prefix(&base)?.split('/').next()?.to_string();
                (!named.contains(&sha)).then_some(sha)
            })
            .collect();
        if unnamed.is_empty() {
            return Ok(());
        }
        let ops = unnamed
            .iter()
            .map(|sha| {
                let options = etcd_client::DeleteOptions::new().with_prefix();
                TxnOp::delete(self.chunk_prefix(sha), Some(options))
            })
            .collect();
        self.commit(ops).await
    }
}
