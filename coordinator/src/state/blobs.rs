//! Model bytes clients sent (and, with etcd, records too large for one
//! etcd value), as files named by their sha-256 in a folder every
//! coordinator of the cluster reads. Blocking: called off the async
//! threads.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::StoreError;

/// The `blobs/` folder.
#[derive(Debug, Clone)]
pub struct Blobs {
    dir: PathBuf,
}

impl Blobs {
    /// `dir/blobs`, made if absent.
    pub fn open(dir: &Path) -> Result<Blobs, StoreError> {
        let dir = dir.join("blobs");
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(Blobs { dir })
    }

    fn path(&self, sha256: &str) -> Option<PathBuf> {
        let hex = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit());
        hex.then(|| self.dir.join(sha256))
    }

    /// Writes blob `sha256` unless it is there (synced, then renamed into
    /// place: never half a file).
    pub fn put(&self, sha256: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let Some(path) = self.path(sha256) else {
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

    pub fn get(&self, sha256: &str) -> Result<bytes::Bytes, StoreError> {
        let path = self
            .path(sha256)
            .ok_or_else(|| StoreError::NoBlob(sha256.to_string()))?;
        match std::fs::read(&path) {
            Ok(b) => Ok(b.into()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(StoreError::NoBlob(sha256.to_string()))
            }
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    /// Deletes the blobs not `named` (and left-over partial writes).
    pub fn collect(&self, named: &BTreeSet<String>) -> Result<(), StoreError> {
        let io = |source| StoreError::Io {
            path: self.dir.clone(),
            source,
        };
        for entry in std::fs::read_dir(&self.dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let file = entry.file_name().to_string_lossy().into_owned();
            if !named.contains(&file) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }
}
