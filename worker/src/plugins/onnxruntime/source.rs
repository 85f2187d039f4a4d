//! Where a compiled subgraph keeps its model between sessions: in memory,
//! or, for a large one, in a private temporary file, so that a worker
//! holds a stage's weights once (in onnxruntime's session) instead of
//! twice. The model is read back only to build another session (all of
//! them busy, or a profiling run) or to export the subgraph.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

/// Models larger than this are kept in a file once compiled.
const IN_FILE_ABOVE: usize = 16 << 20;

/// A compiled subgraph's model.
pub(super) enum ModelSource {
    Memory(Bytes),
    /// A temporary file of this process, removed when dropped.
    File(PathBuf),
}

impl ModelSource {
    /// `onnx` in a temporary file when it is large and one can be written,
    /// else in memory (the bytes shared, not copied).
    pub fn keep(onnx: &Bytes) -> ModelSource {
        if onnx.len() <= IN_FILE_ABOVE {
            return ModelSource::Memory(onnx.clone());
        }
        static FILES: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "tessera-ort-model-{}-{}.onnx",
            std::process::id(),
            FILES.fetch_add(1, Ordering::Relaxed)
        ));
        // A new file only: never one that is there, nor a link's target.
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, onnx));
        match written {
            Ok(()) => ModelSource::File(path),
            Err(e) => {
                tracing::debug!("keeping the model in memory ({}: {e})", path.display());
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    let _ = std::fs::remove_file(&path);
                }
                ModelSource::Memory(onnx.clone())
            }
        }
    }

    /// The model's bytes (read back from its file when it is in one).
    pub fn bytes(&self) -> Result<Bytes, String> {
        match self {
            ModelSource::Memory(b) => Ok(b.clone()),
            ModelSource::File(path) => std::fs::read(path)
                .map(Bytes::from)
                .map_err(|e| format!("cannot read the model back from {}: {e}", path.display())),
        }
    }
}

impl Drop for ModelSource {
    fn drop(&mut self) {
        if let ModelSource::File(path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_model_waits_in_a_file_until_dropped() {
        let small = Bytes::from(vec![7u8; 1024]);
        assert!(matches!(ModelSource::keep(&small), ModelSource::Memory(_)));
        let large = Bytes::from(vec![9u8; IN_FILE_ABOVE + 1]);
        let kept = ModelSource::keep(&large);
        let ModelSource::File(path) = &kept else {
            panic!("a large model is kept in a file where one can be written");
        };
        let path = path.clone();
        assert_eq!(kept.bytes().unwrap(), large);
        drop(kept);
        assert!(!path.exists());
    }
}
