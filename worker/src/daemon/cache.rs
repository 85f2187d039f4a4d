//! The worker's disk caches, each a folder of files named by key and
//! bounded in bytes, the least recently used going first:
//! - [`CompileCache`]: compiled subgraphs by device and model hash, through
//!   the plugins' export/import; a re-deploy of the same subgraph is a file
//!   read;
//! - [`WeightStore`]: large weights by their SHA-256, as deploys bring
//!   them; a deploy of any cut of a model the worker has seen asks for no
//!   weight bytes (see `tessera_common::wire::pieces`).
//!
//! Files are written under a temporary name and renamed into place (a
//! reader never sees half of one), and read memory-mapped. Cache errors
//! are logged and never fail a deployment.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;

/// Each cache's default bound, bytes.
pub const DEFAULT_LIMIT: u64 = 16 << 30;

/// A folder of files by key, bounded in bytes.
#[derive(Debug)]
struct DiskStore {
    dir: PathBuf,
    ext: &'static str,
    limit: u64,
    index: Mutex<Index>,
}

/// What the folder holds, with when each file was last used (a counter).
#[derive(Debug, Default)]
struct Index {
    files: HashMap<String, Entry>,
    clock: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    bytes: u64,
    used: u64,
}

/// The keys to remove, least recently used first, until what stays fits
/// `limit`; `keep` (the file just written) stays whatever its size.
fn evictions(files: &HashMap<String, Entry>, limit: u64, keep: &str) -> Vec<String> {
    let mut total: u64 = files.values().map(|e| e.bytes).sum();
    let mut by_use: Vec<(&String, &Entry)> = files.iter().filter(|(k, _)| *k != keep).collect();
    by_use.sort_by_key(|(k, e)| (e.used, k.as_str()));
    let mut out = Vec::new();
    for (key, entry) in by_use {
        if total <= limit {
            break;
        }
        total -= entry.bytes;
        out.push(key.clone());
    }
    out
}

/// Keys are hex hashes, optionally after a device name: anything else is
/// not a file name.
fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 128
        && !key.starts_with('.')
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

impl DiskStore {
    /// The store in `dir`, indexing the files it already holds (the most
    /// recently modified counted as the most recently used).
    fn open(dir: PathBuf, ext: &'static str, limit: u64) -> DiskStore {
        let mut found: Vec<(std::time::SystemTime, String, u64)> = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                let key = (path.extension().and_then(|e| e.to_str()) == Some(ext))
                    .then(|| path.file_stem().and_then(|s| s.to_str()))
                    .flatten();
                let (Some(key), Ok(meta)) = (key, entry.metadata()) else {
                    continue;
                };
                let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                found.push((modified, key.to_string(), meta.len()));
            }
        }
        found.sort();
        let mut index = Index::default();
        for (_, key, bytes) in found {
            index.clock += 1;
            let used = index.clock;
            index.files.insert(key, Entry { bytes, used });
        }
        DiskStore {
            dir,
            ext,
            limit,
            index: Mutex::new(index),
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        valid_key(key).then(|| self.dir.join(format!("{key}.{}", self.ext)))
    }

    fn holds(&self, key: &str) -> bool {
        self.index().files.contains_key(key)
    }

    /// The file's bytes, memory-mapped; marks it used.
    fn get(&self, key: &str) -> Option<Bytes> {
        let path = self.path(key)?;
        {
            let mut index = self.index();
            index.clock += 1;
            let clock = index.clock;
            index.files.get_mut(key)?.used = clock;
        }
        match map(&path) {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                tracing::warn!("cache file {} unreadable, dropped: {e}", path.display());
                self.remove(key);
                None
            }
        }
    }

    fn remove(&self, key: &str) {
        self.index().files.remove(key);
        if let Some(path) = self.path(key) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Writes the file made of `pieces`, one after another, then removes
    /// the least recently used files beyond the bound.
    fn put(&self, key: &str, pieces: &[Bytes]) {
        let Some(path) = self.path(key) else {
            tracing::warn!("not caching under the key '{key}'");
            return;
        };
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = std::fs::create_dir_all(&self.dir)
            .and_then(|()| write_pieces(&tmp, pieces))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            tracing::warn!("cannot cache {}: {e}", path.display());
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        let bytes = pieces.iter().map(|p| p.len() as u64).sum();
        let gone = {
            let mut index = self.index();
            index.clock += 1;
            let used = index.clock;
            index.files.insert(key.to_string(), Entry { bytes, used });
            let gone = evictions(&index.files, self.limit, key);
            for key in &gone {
                index.files.remove(key);
            }
            gone
        };
        for key in gone {
            tracing::debug!(
                "cache {}: {key} goes (least recently used)",
                self.dir.display()
            );
            if let Some(path) = self.path(&key) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// A file's bytes, memory-mapped (files are replaced by rename, never
/// written in place, so a mapping stays valid), its use time renewed.
fn map(path: &Path) -> std::io::Result<Bytes> {
    let file = std::fs::File::open(path)?;
    let _ = file.set_modified(std::time::SystemTime::now());
    if file.metadata()?.len() == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the cache's files are never modified after their rename into
    // place; removing one leaves an existing mapping intact.
    let mapped = unsafe { memmap2::Mmap::map(&file)? };
    Ok(Bytes::from_owner(mapped))
}

fn write_pieces(path: &Path, pieces: &[Bytes]) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    for piece in pieces {
        file.write_all(piece)?;
    }
    file.flush()
}

/// Compiled subgraphs, keyed `DEVICE-<model hash>`.
#[derive(Debug)]
pub struct CompileCache(DiskStore);

impl CompileCache {
    pub fn open(dir: PathBuf, limit: u64) -> CompileCache {
        CompileCache(DiskStore::open(dir, "blob", limit))
    }

    /// The blob `key`, mapped, with the file it maps.
    pub fn get_file(&self, key: &str) -> Option<(Bytes, PathBuf)> {
        let bytes = self.0.get(key)?;
        Some((bytes, self.0.path(key)?))
    }

    /// Writes the blob made of `pieces`, one after another.
    pub fn put(&self, key: &str, pieces: &[Bytes]) {
        self.0.put(key, pieces)
    }
}

/// Large weights by SHA-256 (hex).
#[derive(Debug)]
pub struct WeightStore(DiskStore);

impl WeightStore {
    pub fn open(dir: PathBuf, limit: u64) -> WeightStore {
        WeightStore(DiskStore::open(dir, "w", limit))
    }

    pub fn holds(&self, sha256: &str) -> bool {
        self.0.holds(sha256)
    }

    /// The weight, checked against its hash (a file that no longer matches
    /// is dropped).
    pub fn get(&self, sha256: &str) -> Option<Bytes> {
        let bytes = self.0.get(sha256)?;
        if tessera_common::wire::pieces::sha256_hex(&bytes) == sha256 {
            return Some(bytes);
        }
        tracing::warn!("kept weight {sha256} no longer matches its hash, dropped");
        self.0.remove(sha256);
        None
    }

    /// Keeps weights whose hashes were checked.
    pub fn put(&self, sha256: &str, bytes: &Bytes) {
        if !self.0.holds(sha256) {
            self.0.put(sha256, std::slice::from_ref(bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_common::wire::pieces::sha256_hex;

    fn entry(bytes: u64, used: u64) -> Entry {
        Entry { bytes, used }
    }

    #[test]
    fn the_least_recently_used_go_first_and_the_new_one_stays() {
        let files: HashMap<String, Entry> = [
            ("a".to_string(), entry(10, 1)),
            ("b".to_string(), entry(10, 3)),
            ("c".to_string(), entry(10, 2)),
            ("new".to_string(), entry(25, 4)),
        ]
        .into();
        assert_eq!(evictions(&files, 55, "new"), Vec::<String>::new());
        assert_eq!(evictions(&files, 45, "new"), vec!["a"]);
        assert_eq!(evictions(&files, 35, "new"), vec!["a", "c"]);
        // Bigger than the bound alone: everything else goes, it stays.
        assert_eq!(evictions(&files, 5, "new"), vec!["a", "c", "b"]);
    }

    #[test]
    fn weights_are_kept_read_back_reindexed_and_bounded() {
        let dir = std::env::temp_dir().join(format!("tessera-weights-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let w = |n: u8| Bytes::from(vec![n; 1000]);
        let store = WeightStore::open(dir.clone(), 2500);
        for n in 0..3 {
            store.put(&sha256_hex(&w(n)), &w(n));
        }
        assert_eq!(store.get(&sha256_hex(&w(1))), Some(w(1)));
        // A fourth pushes out the least recently used: 0 (1 was read).
        store.put(&sha256_hex(&w(3)), &w(3));
        assert!(!store.holds(&sha256_hex(&w(0))));
        assert!(store.holds(&sha256_hex(&w(1))));
        // Opened again, it finds what is on disk.
        let again = WeightStore::open(dir.clone(), 2500);
        assert!(again.holds(&sha256_hex(&w(3))));
        assert!(!again.holds(&sha256_hex(&w(0))));
        // A file that no longer matches its hash is dropped, not served.
        let key = sha256_hex(&w(3));
        std::fs::write(dir.join(format!("{key}.w")), vec![9u8; 1000]).unwrap();
        assert_eq!(again.get(&key), None);
        assert!(!again.holds(&key));
        // Keys that are not file names are refused.
        assert!(!valid_key("../x") && !valid_key(".hidden") && !valid_key(""));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
