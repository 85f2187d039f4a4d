//! Models a worker reads from its own disk. A deploy names where its model
//! was read from ([`DeploySpec::source`]: a named model's path in the
//! coordinator's model repository, or the path a client loaded it from).
//! A worker started with `--models-dir DIR` (repeatable) looks for it under
//! those directories only: the same path when it lies under one of them,
//! else a file or folder of the same name in one. It reads that model as
//! the coordinator does (an ONNX file with its external data; a GGUF built,
//! or taken from the build cache; a model folder), and each weight it
//! lacks is taken from there when its SHA-256 is the one the deploy names:
//! a copy that differs only costs the weights that differ.
//!
//! The weights read stay in memory while deploys use them, and are dropped
//! [`KEEP_IDLE`] after the last.
//!
//! [`DeploySpec::source`]: tessera_common::wire::control::DeploySpec::source

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tessera_common::onnx::proto::ModelProto;

/// How long a model's weights stay in memory after a deploy last used
/// them (the deploys of one load come within seconds of each other).
pub const KEEP_IDLE: Duration = Duration::from_secs(30);

/// Large weights by SHA-256 (hex), as read from a model on this disk.
pub type LocalWeights = Arc<HashMap<String, Bytes>>;

/// Why a model on this disk could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LocalModelError {
    #[error("{path}: {why}")]
    Read { path: PathBuf, why: String },
}

/// The directories this worker may read models from, and the model read
/// last.
pub struct LocalModels {
    /// Canonical paths.
    dirs: Vec<PathBuf>,
    last: Mutex<Option<Read>>,
}

/// A model's weights, read from `path`, last used at `used`.
struct Read {
    path: PathBuf,
    weights: LocalWeights,
    used: Instant,
}

impl LocalModels {
    /// Reading from `dirs` (those that exist; none: `None`).
    pub fn new(dirs: &[PathBuf]) -> Option<LocalModels> {
        let dirs: Vec<PathBuf> = dirs
            .iter()
            .filter_map(|d| match d.canonicalize() {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!("models directory {}: {e}; not read", d.display());
                    None
                }
            })
            .collect();
        (!dirs.is_empty()).then(|| LocalModels {
            dirs,
            last: Mutex::new(None),
        })
    }

    /// Where the model read from `source` is on this disk, under one of
    /// the directories, if it is.
    pub fn find(&self, source: &str) -> Option<PathBuf> {
        candidates(&self.dirs, Path::new(source))
            .into_iter()
            .filter_map(|c| c.canonicalize().ok())
            .find(|c| self.dirs.iter().any(|d| c.starts_with(d)))
    }

    /// The weights of the model at `path` (read at the first ask, then kept
    /// while used). Blocking: hashing a model's weights reads all of them.
    pub fn weights(&self, path: &Path) -> Result<LocalWeights, LocalModelError> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(read) = last.as_mut().filter(|r| r.path == path) {
            read.used = Instant::now();
            return Ok(read.weights.clone());
        }
        // One model at a time: the one before goes first.
        *last = None;
        let started = Instant::now();
        let weights: LocalWeights = Arc::new(read_weights(path)?);
        tracing::info!(
            path = %path.display(),
            weights = weights.len(),
            read_ms = started.elapsed().as_millis() as u64,
            "read a model from this worker's disk"
        );
        *last = Some(Read {
            path: path.to_path_buf(),
            weights: weights.clone(),
            used: Instant::now(),
        });
        Ok(weights)
    }

    /// Drops the weights read if no deploy used them for [`KEEP_IDLE`].
    pub fn forget_idle(&self, now: Instant) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last
            .as_ref()
            .is_some_and(|r| now.saturating_duration_since(r.used) >= KEEP_IDLE)
        {
            *last = None;
        }
    }
}

/// Where a model read from `source` may be under `dirs`: `source` itself
/// when it lies under one (a path without `..`), then `<dir>/<its name>` for
/// each. The caller checks what exists, and that it is under a directory
/// once links are resolved.
pub fn candidates(dirs: &[PathBuf], source: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let plain = source.is_absolute()
        && source
            .components()
            .all(|c| !matches!(c, Component::ParentDir | Component::CurDir));
    if plain && dirs.iter().any(|d| source.starts_with(d)) {
        out.push(source.to_path_buf());
    }
    if let Some(name) = source.file_name() {
        out.extend(dirs.iter().map(|d| d.join(name)));
    }
    out
}

/// A model's large weights by hash, read as the coordinator reads it.
fn read_weights(path: &Path) -> Result<HashMap<String, Bytes>, LocalModelError> {
    let failed = |why: String| LocalModelError::Read {
        path: path.to_path_buf(),
        why,
    };
    let model = read_model(path).map_err(failed)?;
    let parts = tessera_common::onnx::parts::encode_model_parts(&model);
    Ok(tessera_common::wire::pieces::weights_by_hash(parts))
}

#[cfg(feature = "onnxruntime")]
fn read_model(path: &Path) -> Result<ModelProto, String> {
    if tessera_gguf::generative::is_generative(path) {
        // The weights do not depend on how many sequences a copy keeps.
        let read = tessera_gguf::generative::read(path, 1).map_err(|e| e.to_string())?;
        return tessera_common::onnx::decode_model_shared(read.model).map_err(|e| e.to_string());
    }
    mapped_onnx(path)
}

#[cfg(not(feature = "onnxruntime"))]
fn read_model(path: &Path) -> Result<ModelProto, String> {
    if path.is_dir() {
        return Err("a model folder is read by the onnxruntime build only".into());
    }
    mapped_onnx(path)
}

/// An ONNX file over a memory map (its weights are slices of the file's
/// pages, which the kernel may drop and read again: a model bigger than
/// this worker's memory is read for the few weights it needs), with any
/// external data read in.
fn mapped_onnx(path: &Path) -> Result<ModelProto, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    if file.metadata().map_err(|e| e.to_string())?.len() == 0 {
        return Err("an empty file".into());
    }
    // SAFETY: a read-only map of a model file, as llama.cpp maps a GGUF:
    // the weights taken from it are copied into the subgraph's model
    // within the deploy, and their hashes checked when it was read. A file
    // cut short while it is read faults this process (a model repository's
    // files are replaced, not rewritten in place).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| e.to_string())?;
    let mut model = tessera_common::onnx::decode_model_shared(Bytes::from_owner(map))
        .map_err(|e| e.to_string())?;
    let base = path.parent().unwrap_or(Path::new("."));
    tessera_common::onnx::load_model_with_base_dir(
        &mut model,
        base,
        tessera_common::onnx::ExternalDataPolicy::Inline,
    )
    .map_err(|e| e.to_string())?;
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_looked_for_at_its_path_under_a_directory_then_by_name() {
        let dirs = [PathBuf::from("/models"), PathBuf::from("/mnt/copies")];
        assert_eq!(
            candidates(&dirs, Path::new("/models/llm/smollm2")),
            [
                "/models/llm/smollm2",
                "/models/smollm2",
                "/mnt/copies/smollm2"
            ]
            .map(PathBuf::from)
        );
        // Elsewhere, or relative (a client's path): by its name only.
        assert_eq!(
            candidates(&dirs, Path::new("/home/me/rec.onnx")),
            ["/models/rec.onnx", "/mnt/copies/rec.onnx"].map(PathBuf::from)
        );
        assert_eq!(
            candidates(&dirs, Path::new("models/rec.onnx")),
            ["/models/rec.onnx", "/mnt/copies/rec.onnx"].map(PathBuf::from)
        );
        // A way out of the directory is not taken as the path.
        assert_eq!(
            candidates(&dirs, Path::new("/models/../etc/passwd")),
            ["/models/passwd", "/mnt/copies/passwd"].map(PathBuf::from)
        );
        assert!(candidates(&dirs, Path::new("/")).is_empty());
    }

    #[test]
    fn a_model_on_disk_is_found_only_under_the_directories_and_its_weights_are_kept_while_used() {
        let root = std::env::temp_dir().join(format!("tessera-local-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (dir, outside) = (root.join("models"), root.join("elsewhere"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let model = tessera_common::synth::matmul_chain(2, 256, 7);
        let bytes = tessera_common::onnx::encode_model(&model);
        std::fs::write(dir.join("m.onnx"), &bytes).unwrap();
        std::fs::write(outside.join("secret.onnx"), &bytes).unwrap();
        let local = LocalModels::new(std::slice::from_ref(&dir)).unwrap();
        let inside = dir.canonicalize().unwrap().join("m.onnx");
        // By name from a client's path, and at its own path.
        assert_eq!(local.find("/home/me/m.onnx"), Some(inside.clone()));
        assert_eq!(
            local.find(&inside.display().to_string()),
            Some(inside.clone())
        );
        assert_eq!(
            local.find(&outside.join("secret.onnx").display().to_string()),
            None
        );
        // A link out of the directory is not followed there.
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(outside.join("secret.onnx"), dir.join("link.onnx")).unwrap();
            assert_eq!(local.find("/x/link.onnx"), None);
        }
        let weights = local.weights(&inside).unwrap();
        let parts = tessera_common::onnx::parts::encode_model_parts(&model);
        assert_eq!(
            *weights,
            tessera_common::wire::pieces::weights_by_hash(parts)
        );
        assert!(!weights.is_empty());
        // Kept while used, dropped once idle.
        assert!(Arc::ptr_eq(&weights, &local.weights(&inside).unwrap()));
        local.forget_idle(Instant::now());
        assert!(local.last.lock().unwrap().is_some());
        local.forget_idle(Instant::now() + KEEP_IDLE);
        assert!(local.last.lock().unwrap().is_none());
        // Not a model: a clear error.
        std::fs::write(dir.join("junk.onnx"), b"not a model").unwrap();
        let err = local.weights(&dir.join("junk.onnx")).unwrap_err();
        assert!(err.to_string().contains("junk.onnx"), "{err}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
