//! The state store on disk: `state.redb` (tables `meta`, `networks`,
//! `models`; values are JSON) and `blobs/` (model bytes by sha-256).
//! Blocking: called off the async threads.

// redb's error type is 160 bytes; its results come back from a disk write
// at most a few times per load, never on a request's path.
#![allow(clippy::result_large_err)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableTable, TableDefinition};

use super::records::{ModelRecord, ModelRef, NetworkRecord};

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
}

/// The store: one redb database and a folder of blobs.
pub struct Store {
    db: Database,
    path: PathBuf,
    blobs: PathBuf,
}

impl Store {
    /// Opens `dir/state.redb` (made, with `dir`, if absent). A second
    /// coordinator on the same folder is refused (redb locks the file).
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let io = |source| StoreError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let blobs = dir.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(io)?;
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

    fn blob_path(&self, sha256: &str) -> Option<PathBuf> {
        let hex = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit());
        hex.then(|| self.blobs.join(sha256))
    }

    /// Writes blob `sha256` unless it is there (synced, then renamed into
    /// place).
    pub fn put_blob(&self, sha256: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let Some(path) = self.blob_path(sha256) else {
            return Err(StoreError::NoBlob(sha256.to_string()));
        };
        if path.exists() {
            return Ok(());
        }
        let io = |source| StoreError::Io {
            path: path.clone(),
            source,
        };
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = (|| {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(io)
    }

    pub fn blob(&self, sha256: &str) -> Result<bytes::Bytes, StoreError> {
        let path = self
            .blob_path(sha256)
            .ok_or_else(|| StoreError::NoBlob(sha256.to_string()))?;
        match std::fs::read(&path) {
            Ok(b) => Ok(b.into()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(StoreError::NoBlob(sha256.to_string()))
            }
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    /// Deletes the blobs no record names (and left-over partial writes).
    pub fn collect_blobs(&self) -> Result<(), StoreError> {
        let mut named: BTreeSet<String> = BTreeSet::new();
        let mut name = |m: &ModelRef| {
            if let ModelRef::Blob { sha256 } = m {
                named.insert(sha256.clone());
            }
        };
        self.networks()?.iter().for_each(|n| name(&n.model));
        self.models()?.iter().for_each(|m| name(&m.source));
        let io = |source| StoreError::Io {
            path: self.blobs.clone(),
            source,
        };
        for entry in std::fs::read_dir(&self.blobs).map_err(io)? {
            let entry = entry.map_err(io)?;
            let file = entry.file_name().to_string_lossy().into_owned();
            if !named.contains(&file) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }
}

fn json<T: serde::Serialize>(what: &str, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|source| StoreError::Record {
        what: what.to_string(),
        source,
    })
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Record {
        what: what.to_string(),
        source,
    })
}
