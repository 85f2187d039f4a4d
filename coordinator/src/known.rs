//! Model bytes the coordinator has already, found by their SHA-256, so a
//! client loading a model again names it (`LoadKnown`) and sends nothing:
//! a loaded network's bytes, the state store's, or the models cache
//! (`models/` in the `cache_dir` of the coordinator's configuration, by
//! default Tessera's cache folder), where the bytes of each load a client sent are
//! written once it is loaded. The cache keeps the [`KEEP`] most recently
//! used models, as long as they come to [`KEEP_BYTES`] (the newest is
//! kept whatever its size); a file is written under a name of its own and renamed
//! into place, so two coordinators sharing the folder never see half a
//! file, and a file being read stays readable when it is removed (it is
//! mapped).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::network::{Loaded, Origin};
use crate::Shared;

/// Models kept in the cache beyond those loaded now.
pub const KEEP: usize = 4;

/// What the models kept may come to, bytes: a few language models, well
/// within a node's disk.
pub const KEEP_BYTES: u64 = 8 << 30;

/// The models cache's folder (`None` where neither the configuration nor
/// the environment names one).
fn cache_dir(shared: &Shared) -> Option<PathBuf> {
    let configured = &shared.config.cache_dir;
    let root = if configured.as_os_str().is_empty() {
        tessera_gguf::cache::cache_root()?
    } else {
        configured.clone()
    };
    Some(root.join("models"))
}

/// The bytes with SHA-256 `sha256` (hex), if this coordinator has them.
pub async fn find(shared: &Arc<Shared>, sha256: &str) -> Option<Bytes> {
    if !is_sha256(sha256) {
        return None;
    }
    let loaded = shared
        .networks
        .iter()
        .find(|n| n.model_sha.get().is_some_and(|s| s == sha256))
        .and_then(|n| n.model());
    if loaded.is_some() {
        return loaded;
    }
    let (shared, sha256) = (shared.clone(), sha256.to_string());
    tokio::task::spawn_blocking(move || {
        shared
            .state
            .blob(&sha256)
            .ok()
            .or_else(|| read(&cache_dir(&shared)?, &sha256))
    })
    .await
    .ok()
    .flatten()
}

/// Writes the bytes a client sent for `loaded` into the models cache (its
/// hash computed if it was not yet), off the async threads; logged, never
/// failed.
pub fn remember(shared: &Shared, loaded: &Arc<Loaded>) {
    if !matches!(loaded.origin, Origin::Sent) {
        return;
    }
    let Some(dir) = cache_dir(shared) else {
        return;
    };
    let loaded = loaded.clone();
    tokio::task::spawn_blocking(move || {
        let Some(model) = loaded.model() else {
            return;
        };
        let sha256 = loaded.model_sha();
        if let Err(e) = write(&dir, &sha256, &model) {
            tracing::warn!(dir = %dir.display(), "cannot keep the model in the models cache: {e}");
        }
        prune(&dir, KEEP, KEEP_BYTES);
    });
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The cached file `sha256` in `dir`, mapped, its use time renewed.
fn read(dir: &Path, sha256: &str) -> Option<Bytes> {
    let file = std::fs::File::open(dir.join(sha256)).ok()?;
    let _ = file.set_modified(std::time::SystemTime::now());
    if file.metadata().ok()?.len() == 0 {
        return None;
    }
    // SAFETY: the cache's files are written under a name of their own and
    // renamed into place, never written after; removing one leaves an
    // existing mapping intact.
    let mapped = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    Some(Bytes::from_owner(mapped))
}

/// Writes `bytes` as `dir/sha256` unless it is there (its use time then
/// renewed).
fn write(dir: &Path, sha256: &str, bytes: &[u8]) -> std::io::Result<()> {
    let path = dir.join(sha256);
    if let Ok(file) = std::fs::File::options().append(true).open(&path) {
        return file.set_modified(std::time::SystemTime::now());
    }
    std::fs::create_dir_all(dir)?;
    // A name of its own: coordinators in one process (embedded clusters)
    // may write the same model at once.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{sha256}.{}.{n}", std::process::id()));
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Removes all but the `keep` most recently used models that come to at
/// most `keep_bytes` (the newest always stays), and files being written an
/// hour ago (left by a process that died writing them).
fn prune(dir: &Path, keep: usize, keep_bytes: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let mut models: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
    for e in entries.flatten() {
        let meta = e.metadata();
        let size = meta.as_ref().map_or(0, std::fs::Metadata::len);
        let used = meta.and_then(|m| m.modified());
        let used = used.unwrap_or(std::time::UNIX_EPOCH);
        let name = e.file_name().to_string_lossy().into_owned();
        if is_sha256(&name) {
            models.push((used, size, e.path()));
        } else if name.starts_with('.')
            && now
                .duration_since(used)
                .is_ok_and(|age| age.as_secs() > 3600)
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
    models.sort_by_key(|m| std::cmp::Reverse(m.0));
    let mut total = 0u64;
    for (k, (_, size, path)) in models.into_iter().enumerate() {
        total = total.saturating_add(size);
        if k == 0 || (k < keep && total <= keep_bytes) {
            continue;
        }
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::debug!(path = %path.display(), "cannot remove a cached model: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(n: u8) -> String {
        format!("{n:064x}")
    }

    #[test]
    fn a_kept_model_is_read_back_and_the_least_recently_used_go_first() {
        let dir = std::env::temp_dir().join(format!("tessera-known-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for n in 0..4u8 {
            write(&dir, &sha(n), &[n; 100]).unwrap();
            let at =
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + n as u64);
            std::fs::File::options()
                .append(true)
                .open(dir.join(sha(n)))
                .unwrap()
                .set_modified(at)
                .unwrap();
        }
        // Reading renews its use: model 0 is now the newest.
        assert_eq!(read(&dir, &sha(0)).unwrap(), Bytes::from(vec![0u8; 100]));
        prune(&dir, 3, 250);
        assert!(read(&dir, &sha(2)).is_none(), "the third is over 250 bytes");
        prune(&dir, 2, u64::MAX);
        assert!(read(&dir, &sha(0)).is_some());
        assert!(read(&dir, &sha(3)).is_some());
        assert!(read(&dir, &sha(1)).is_none());
        // Model 3, read last, is the newest: it stays whatever its size.
        prune(&dir, 2, 10);
        assert!(read(&dir, &sha(0)).is_none());
        assert!(read(&dir, &sha(3)).is_some());
        // Written again: kept as it is, its use renewed.
        write(&dir, &sha(3), b"other").unwrap();
        assert_eq!(read(&dir, &sha(3)).unwrap().len(), 100);
        assert!(!is_sha256("../etc/passwd"));
        assert!(read(&dir, "nothing").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
