//! Built GGUFs kept on disk by the file's SHA-256, so that a second load
//! of the same file builds nothing: the encoded model (weights inline) is
//! memory-mapped back and the generation spec read from a small JSON.
//!
//! Layout under `$TESSERA_CACHE_DIR` (else `$XDG_CACHE_HOME/tessera`, else
//! `~/.cache/tessera`), folder `gguf/`:
//! - `<sha256>-b<builder>-a<accuracy>-<native|portable>/model.onnx` and
//!   `generation.json`
//!   (written last: an entry without it is incomplete and made again);
//! - `hash-<key>`: a file's SHA-256, keyed by its path, size, modification
//!   time and inode, so an unchanged file is not hashed again.
//!
//! Entries used within the last hour are kept, and beyond them the most
//! recently used [`KEEP`]: a model repository's GGUFs keep their builds
//! while they are being loaded, by one process or several.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tessera_common::wire::generate::GenerationSpec;

use crate::model::{BuildOptions, GgufModel};
use crate::GgufError;

/// Bumped whenever the graph or the tokenizer a GGUF builds into changes:
/// entries of other builders are never read.
pub const BUILDER_VERSION: u32 = 5;
/// Entries kept beyond those used lately (the least recently used go
/// first).
pub const KEEP: usize = 4;
/// Entries used within this long are never pruned: a model repository's
/// GGUFs, loaded one after another or by processes side by side, keep
/// their builds however many there are.
const RECENT: std::time::Duration = std::time::Duration::from_secs(3600);

/// A GGUF built, as a loader holds it.
pub struct Built {
    /// The encoded ONNX model, weights inline (a memory map of the cached
    /// file where there is a cache).
    pub model: Bytes,
    pub spec: GenerationSpec,
    /// Whether it came from the cache.
    pub cached: bool,
}

#[derive(Serialize, Deserialize)]
struct Generation {
    spec: GenerationSpec,
    tokenizer_json: String,
}

/// The cache's folder, if the environment names a home for it.
pub fn cache_dir() -> Option<PathBuf> {
    Some(cache_root()?.join("gguf"))
}

/// Tessera's cache folder: `$TESSERA_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/tessera`, else `~/.cache/tessera` (none where the
/// environment names no home).
pub fn cache_root() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("TESSERA_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("tessera")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("tessera")))
}

/// The model of the GGUF at `path`, from the cache or built (and cached
/// where the cache's folder can be written); each copy keeps state for
/// `max_sequences` sequences.
pub fn load(path: &Path, options: &BuildOptions, max_sequences: u32) -> Result<Built, GgufError> {
    match cache_dir().filter(|d| std::fs::create_dir_all(d).is_ok()) {
        Some(dir) => load_in(&dir, path, options, max_sequences),
        None => build_in_memory(path, options, max_sequences),
    }
}

/// [`load`] with the cache in `dir`.
pub fn load_in(
    dir: &Path,
    path: &Path,
    options: &BuildOptions,
    max_sequences: u32,
) -> Result<Built, GgufError> {
    let sha = file_sha256(path, dir)?;
    let kernels = if options.native { "native" } else { "portable" };
    let entry = dir.join(format!(
        "{sha}-b{BUILDER_VERSION}-a{}-{kernels}",
        options.accuracy_level
    ));
    if !entry.join(GENERATION).exists() {
        store(path, options, &entry)?;
        prune(dir);
    }
    match open(&entry, max_sequences) {
        Ok(built) => Ok(built),
        // Another process pruned it between the check and the read (its
        // files go one by one): built once more.
        Err(e) => {
            tracing::debug!("the cached build went away ({e}); building again");
            store(path, options, &entry)?;
            open(&entry, max_sequences)
        }
    }
}

const MODEL: &str = "model.onnx";
const GENERATION: &str = "generation.json";

fn io_error(path: &Path) -> impl Fn(std::io::Error) -> GgufError {
    let path = path.display().to_string();
    move |source| GgufError::Io {
        path: path.clone(),
        source,
    }
}

/// Builds the GGUF at `path` into the cache entry `entry`: the model, then
/// the generation spec (which marks the entry complete), each written
/// under a name of this process's and renamed, so that processes building
/// the same entry at once do not mix their files.
fn store(path: &Path, options: &BuildOptions, entry: &Path) -> Result<(), GgufError> {
    tracing::info!(path = %path.display(), "building the GGUF's model (cached in {})", entry.display());
    let built = GgufModel::read(path, options)?;
    // The spec as read: each load sets its own sequences.
    let spec = built.generation_spec(1)?;
    std::fs::create_dir_all(entry).map_err(io_error(entry))?;
    let model_path = entry.join(MODEL);
    write_model(&built.model, &model_path).map_err(io_error(&model_path))?;
    let text = serde_json::to_string(&Generation {
        spec,
        tokenizer_json: built.tokenizer_json.clone(),
    })
    .unwrap_or_default();
    drop(built);
    give_back_freed_memory();
    let generation = entry.join(GENERATION);
    let tmp = temporary(&generation);
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &generation))
        .map_err(io_error(&generation))
}

/// Hands the heap's freed pages back to the system (glibc keeps freed
/// blocks below its mmap threshold, here the weights of a few megabytes
/// each: 211 MiB of a 1B model's build stayed resident beside the cached
/// model mapped back, 1.44× the file at the peak instead of 1.17×).
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A complete entry: its model mapped, its spec read.
fn open(entry: &Path, max_sequences: u32) -> Result<Built, GgufError> {
    let generation = entry.join(GENERATION);
    let text = std::fs::read_to_string(&generation).map_err(io_error(&generation))?;
    let Generation {
        mut spec,
        tokenizer_json,
    } = serde_json::from_str(&text).map_err(|e| GgufError::Io {
        path: generation.display().to_string(),
        source: std::io::Error::other(e),
    })?;
    spec.tokenizer_json = tokenizer_json;
    spec.max_sequences = max_sequences;
    let _ = touch(&generation);
    let model_path = entry.join(MODEL);
    let file = std::fs::File::open(&model_path).map_err(io_error(&model_path))?;
    // The cache's own file, written once under a temporary name and never
    // changed in place; its pages given back once read (`pages`).
    let map = crate::pages::map(&file).map_err(io_error(&model_path))?;
    Ok(Built {
        model: map,
        spec,
        cached: true,
    })
}

/// `path` with this process's and this moment's mark.
fn temporary(path: &Path) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}-{nanos}.part", std::process::id()));
    path.with_file_name(name)
}

/// Without a cache: built and encoded in memory.
fn build_in_memory(
    path: &Path,
    options: &BuildOptions,
    max_sequences: u32,
) -> Result<Built, GgufError> {
    let built = GgufModel::read(path, options)?;
    let spec = built.generation_spec(max_sequences)?;
    let parts = tessera_common::onnx::parts::encode_parts(&built.model);
    drop(built);
    let mut model = Vec::with_capacity(tessera_common::onnx::parts::parts_len(&parts) as usize);
    for part in parts {
        model.extend_from_slice(&part);
    }
    Ok(Built {
        model: model.into(),
        spec,
        cached: false,
    })
}

/// Writes the model's encoding piece by piece (weights straight from
/// their buffers) under a temporary name, then renames it.
fn write_model(
    model: &tessera_common::onnx::proto::ModelProto,
    path: &Path,
) -> std::io::Result<()> {
    let tmp = temporary(path);
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
    for part in tessera_common::onnx::parts::encode_parts(model) {
        out.write_all(&part)?;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The file's SHA-256 (hex), remembered by path, size, modification time
/// and inode.
fn file_sha256(path: &Path, dir: &Path) -> Result<String, GgufError> {
    let io = |source| GgufError::Io {
        path: path.display().to_string(),
        source,
    };
    let identity = file_identity(path).map_err(io)?;
    remembered_sha256_in(dir, &identity, || {
        let mut file = std::fs::File::open(path)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(hex(&hasher.finalize()))
    })
    .map_err(io)
}

/// What a file is known by while it is unchanged: its real path, size,
/// modification time and inode.
pub fn file_identity(path: &Path) -> std::io::Result<String> {
    let meta = std::fs::metadata(path)?;
    let real = std::fs::canonicalize(path)?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0u64;
    Ok(format!(
        "{}\n{}\n{modified}\n{inode}",
        real.display(),
        meta.len()
    ))
}

/// The SHA-256 (hex) of bytes made from unchanged sources, remembered by
/// `identity` (what they were made from: [`file_identity`] of each file,
/// and how) in the cache's folder, so that they are not hashed again;
/// `hash` computes it the first time (and wherever no cache folder can be
/// made).
pub fn remembered_sha256(
    identity: &str,
    hash: impl FnOnce() -> std::io::Result<String>,
) -> std::io::Result<String> {
    match cache_dir().filter(|d| std::fs::create_dir_all(d).is_ok()) {
        Some(dir) => remembered_sha256_in(&dir, identity, hash),
        None => hash(),
    }
}

/// `bytes`' SHA-256, remembered by `identity` ([`remembered_sha256`]);
/// hashed again when its sources cannot be named (`identity` is an
/// error).
pub fn remembered_sha256_of(identity: std::io::Result<String>, bytes: &[u8]) -> Option<String> {
    let hash = || Ok(tessera_common::wire::pieces::sha256_hex(bytes));
    match identity {
        Ok(identity) => remembered_sha256(&identity, hash).ok(),
        Err(_) => hash().ok(),
    }
}

fn remembered_sha256_in(
    dir: &Path,
    identity: &str,
    hash: impl FnOnce() -> std::io::Result<String>,
) -> std::io::Result<String> {
    let memo = dir.join(format!(
        "hash-{}",
        hex(&Sha256::digest(identity.as_bytes()))
    ));
    if let Ok(sha) = std::fs::read_to_string(&memo) {
        if sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(sha);
        }
    }
    let sha = hash()?;
    let _ = std::fs::write(&memo, &sha);
    Ok(sha)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Marks an entry used now.
fn touch(path: &Path) -> std::io::Result<()> {
    std::fs::File::options()
        .append(true)
        .open(path)?
        .set_modified(std::time::SystemTime::now())
}

/// Hash memos kept (the most recently written).
const KEEP_HASHES: usize = 64;

/// Removes the entries not used within [`RECENT`] beyond the [`KEEP`]
/// most recently used, and all but the [`KEEP_HASHES`] newest hash memos.
fn prune(dir: &Path) {
    prune_hashes(dir);
    let Ok(read) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = read
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| {
            // An entry being built has no spec yet: its folder's time.
            let used = std::fs::metadata(e.path().join(GENERATION))
                .or_else(|_| std::fs::metadata(e.path()))
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            (used, e.path())
        })
        .collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.0));
    let now = std::time::SystemTime::now();
    let recent = |t: &std::time::SystemTime| now.duration_since(*t).is_ok_and(|age| age < RECENT);
    let entries: Vec<_> = entries
        .into_iter()
        .enumerate()
        .filter(|(i, (used, _))| *i >= KEEP && !recent(used))
        .map(|(_, e)| e)
        .collect();
    for (_, path) in entries {
        if let Err(e) = std::fs::remove_dir_all(&path) {
            tracing::warn!(path = %path.display(), "cannot remove an old GGUF build: {e}");
        }
    }
}

fn prune_hashes(dir: &Path) {
    let Ok(read) = std::fs::read_dir(dir) else {
        return;
    };
    let mut memos: Vec<(std::time::SystemTime, PathBuf)> = read
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("hash-"))
        .map(|e| {
            let written = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            (written, e.path())
        })
        .collect();
    memos.sort_by_key(|m| std::cmp::Reverse(m.0));
    for (_, path) in memos.into_iter().skip(KEEP_HASHES) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_load_of_the_same_file_builds_nothing() {
        let dir = std::env::temp_dir().join(format!("tessera-gguf-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let gguf = dir.join("tiny.gguf");
        std::fs::write(&gguf, crate::testing::tiny_llama(&Default::default())).unwrap();
        let cache = dir.join("cache");
        let options = BuildOptions::default();
        let first = load_in(&cache, &gguf, &options, 3).unwrap();
        let entry = std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .find(|e| e.path().is_dir())
            .unwrap()
            .path();
        let built_at = std::fs::metadata(entry.join(MODEL))
            .unwrap()
            .modified()
            .unwrap();
        let second = load_in(&cache, &gguf, &options, 5).unwrap();
        assert_eq!(first.model, second.model);
        assert_eq!(second.spec.max_sequences, 5);
        assert_eq!(
            std::fs::metadata(entry.join(MODEL))
                .unwrap()
                .modified()
                .unwrap(),
            built_at,
            "the cached model was not written again"
        );
        // Other options are another entry.
        load_in(&cache, &gguf, &BuildOptions::portable(true), 1).unwrap();
        let entries = std::fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .count();
        assert_eq!(entries, 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
