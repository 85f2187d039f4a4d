//! The state store on disk: `state.redb` (tables `meta`, `networks`,
//! `models`; values are JSON) and `blobs/` (model bytes by sha-256;
//! [`Blobs`]).
//! Blocking: called off the async threads.

// redb's error type is 160 bytes; its results come back from a disk write
// at most a few times per load, never on a request's path.
#![allow(clippy::result_large_err)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableTable, TableDefinition};

use super::blobs::Blobs;
use super::records::{ModelRecord, NetworkRecord};
use super::Change;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const NETWORKS: TableDefinition<u64, &[u8]> = TableDefinition::new("networks");
const MODELS: TableDefinition<&str, &[u8]> = TableDefinition::new("models");

/// Why the state store cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the state store {}: {source}", path.display())]
    Db {
        path: PathBuf,
        source: Box<redb::Error>,
    },
    #[error("a kept record ({what}) cannot be read or written: {source}")]
    Record {
        what: String,
        source: serde_json::Error,
    },
    #[error("no kept model bytes with sha-256 {0}")]
    NoBlob(String),
    /// The store's blocking task (`what` it did) failed: it panicked or
    /// was cancelled.
    #[error("the state store's task ({what}): {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    /// etcd: a read or write failed (unreachable, refused, no answer).
    #[error("etcd: {0}")]
    Etcd(#[from] crate::ha::EtcdError),
    /// etcd: a large value's chunks (sha-256 given) are not its bytes.
    #[error("etcd: the chunks of {0} do not add up to it")]
    BadChunks(String),
    /// etcd: the write was refused because this coordinator no longer
    /// leads (its candidacy's key is gone or another leads).
    #[error("refused: this coordinator no longer leads (epoch {0})")]
    Fenced(u64),
}

/// The store: one redb database and a folder of blobs.
pub struct Store {
    db: Database,
    path: PathBuf,
    blobs: Blobs,
}

impl Store {
    /// Opens `dir/state.redb` (made, with `dir`, if absent). A second
    /// coordinator on the same folder is refused (redb locks the file).
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let io = |source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let blobs = Blobs::open(dir)?;
        let path = dir.join("state.redb");
        let db = Database::create(&path).map_err(|e| StoreError::Db {
            path: path.clone(),
            source: Box::new(e.into()),
        })?;
        let store = Store { db, path, blobs };
        // Every table exists from here on (reads need them).
        store.transaction(|tx| {
            tx.open_table(META)?;
            tx.open_table(NETWORKS)?;
            tx.open_table(MODELS)?;
            Ok(())
        })?;
        Ok(store)
    }

    fn db_error(&self, e: impl Into<redb::Error>) -> StoreError {
        StoreError::Db {
            path: self.path.clone(),
            source: Box::new(e.into()),
        }
    }

    /// Runs `f` in one write transaction and commits it.
    fn transaction(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(|e| self.db_error(e))?;
        f(&tx).map_err(|e| self.db_error(e))?;
        tx.commit().map_err(|e| self.db_error(e))
    }

    fn meta(&self, key: &str) -> Result<u64, StoreError> {
        let tx = self.db.begin_read().map_err(|e| self.db_error(e))?;
        let table = tx.open_table(META).map_err(|e| self.db_error(e))?;
        let value = table.get(key).map_err(|e| self.db_error(e))?;
        Ok(value.map_or(0, |v| v.value()))
    }

    /// A new epoch: one more than the last start's.
    pub fn start_epoch(&self) -> Result<u64, StoreError> {
        let epoch = self.meta("epoch")? + 1;
        self.transaction(|tx| {
            tx.open_table(META)?.insert("epoch", epoch)?;
            Ok(())
        })?;
        Ok(epoch)
    }

    /// The first id not reserved yet.
    pub fn reserved_ids(&self) -> Result<u64, StoreError> {
        self.meta("next_id")
    }

    /// Reserves every id below `upto`.
    pub fn reserve_ids(&self, upto: u64) -> Result<(), StoreError> {
        self.transaction(|tx| {
            tx.open_table(META)?.insert("next_id", upto)?;
            Ok(())
        })
    }

    pub fn put_network(&self, record: &NetworkRecord) -> Result<(), StoreError> {
        let value = json(&format!("network {}", record.id), record)?;
        self.transaction(|tx| {
            tx.open_table(NETWORKS)?
                .insert(record.id, value.as_slice())?;
            Ok(())
        })
    }

    /// A network record that is not JSON (what a damaged store holds).
    #[cfg(test)]
    pub fn put_garbage_network(&self, id: u64) -> Result<(), StoreError> {
        self.transaction(|tx| {
            tx.open_table(NETWORKS)?
                .insert(id, b"{not json".as_slice())?;
            Ok(())
        })
    }

    pub fn remove_network(&self, id: u64) -> Result<(), StoreError> {
        self.transaction(|tx| {
            tx.open_table(NETWORKS)?.remove(id)?;
            Ok(())
        })
    }

    /// Replaces every model record with `records`.
    pub fn put_models(&self, records: &[ModelRecord]) -> Result<(), StoreError> {
        let values = records
            .iter()
            .map(|r| Ok((r.name.as_str(), json(&format!("model {}", r.name), r)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        self.transaction(|tx| {
            let mut table = tx.open_table(MODELS)?;
            table.retain(|_, _| false)?;
            for (name, value) in &values {
                table.insert(*name, value.as_slice())?;
            }
            Ok(())
        })
    }

    pub fn networks(&self) -> Result<Vec<NetworkRecord>, StoreError> {
        self.records(NETWORKS, "network")
    }

    pub fn models(&self) -> Result<Vec<ModelRecord>, StoreError> {
        self.records(MODELS, "model")
    }

    /// Every record of `table` (`what` names them in errors, with the key).
    fn records<K, T>(
        &self,
        table: TableDefinition<K, &[u8]>,
        what: &str,
    ) -> Result<Vec<T>, StoreError>
    where
        K: redb::Key + 'static,
        for<'a> K::SelfType<'a>: std::fmt::Display,
        T: serde::de::DeserializeOwned,
    {
        let tx = self.db.begin_read().map_err(|e| self.db_error(e))?;
        let table = tx.open_table(table).map_err(|e| self.db_error(e))?;
        let mut all = Vec::new();
        for item in table.iter().map_err(|e| self.db_error(e))? {
            let (key, value) = item.map_err(|e| self.db_error(e))?;
            all.push(parse(&format!("{what} {}", key.value()), value.value())?);
        }
        Ok(all)
    }

    /// Writes blob `sha256` unless it is there.
    pub fn put_blob(&self, sha256: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.blobs.put(sha256, bytes)
    }

    pub fn blob(&self, sha256: &str) -> Result<bytes::Bytes, StoreError> {
        self.blobs.get(sha256)
    }

    pub fn blobs(&self) -> &Blobs {
        &self.blobs
    }

    /// Deletes the blobs no record names (and left-over partial writes).
    pub fn collect_blobs(&self) -> Result<(), StoreError> {
        let mut named = BTreeSet::new();
        self.networks()?
            .iter()
            .for_each(|n| named.extend(n.model.kept_as().map(String::from)));
        self.models()?
            .iter()
            .for_each(|m| named.extend(m.source.blob().map(String::from)));
        self.blobs.collect(&named)
    }

    /// Makes `change` (one committed transaction per record, blobs first).
    pub fn apply(&self, change: Change) -> Result<(), StoreError> {
        match change {
            Change::ReserveIds(upto) => self.reserve_ids(upto),
            Change::PutNetwork(record, bytes) => {
                if let (Some(sha256), Some(bytes)) = (record.model.blob(), bytes) {
                    self.put_blob(sha256, &bytes)?;
                }
                self.put_network(&record)
            }
            Change::RemoveNetwork(id) => {
                self.remove_network(id)?;
                self.collect_blobs()
            }
            Change::PutModels(records) => {
                for (record, bytes) in &records {
                    if let (Some(sha256), Some(bytes)) = (record.source.blob(), bytes) {
                        self.put_blob(sha256, bytes)?;
                    }
                }
                let records: Vec<ModelRecord> = records.into_iter().map(|(r, _)| r).collect();
                self.put_models(&records)?;
                self.collect_blobs()
            }
        }
    }
}

pub(super) fn json<T: serde::Serialize>(what: &str, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|source| StoreError::Record {
        what: what.to_string(),
        source,
    })
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(
    what: &str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Record {
        what: what.to_string(),
        source,
    })
}
