//! Where a compiled subgraph keeps its model between sessions: in memory,
//! or, for a large one, in a private temporary file, so that a worker
//! holds a stage's weights once (in onnxruntime's session) instead of
//! twice. The model is read back only to build another session (all of
//! them busy, or a profiling run) or to export the subgraph.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

/// Models larger than this are kept in a file once compiled.
const IN_FILE_ABOVE: usize = 16 << 20;

/// A compiled subgraph's model.
pub(super) enum ModelSource {
    Memory(Bytes),
    File(KeptFile),
}

/// A temporary file of this process holding a model. On Linux its name is
/// removed as soon as it is written and it is reached through
/// `/proc/self/fd`: the kernel frees it when the process ends, however it
/// ends (a killed worker leaves nothing in the temporary directory).
/// Elsewhere the file is removed when dropped.
pub(super) struct KeptFile {
    /// The name it was written under.
    name: PathBuf,
    /// What opens it: `/proc/self/fd/N`, or its name.
    path: PathBuf,
    unlinked: bool,
    _file: std::fs::File,
}

impl KeptFile {
    /// Writes `onnx` to a new file in the temporary directory.
    fn write(onnx: &[u8]) -> std::io::Result<KeptFile> {
        static FILES: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "tessera-ort-model-{}-{}.onnx",
            std::process::id(),
            FILES.fetch_add(1, Ordering::Relaxed)
        ));
        // A new file only: never one that is there, nor a link's target.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        if let Err(e) = std::io::Write::write_all(&mut file, onnx) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let by_fd = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
            if by_fd.exists() && std::fs::remove_file(&path).is_ok() {
                return Ok(KeptFile {
                    name: path,
                    path: by_fd,
                    unlinked: true,
                    _file: file,
                });
            }
        }
        Ok(KeptFile {
            name: path.clone(),
            path,
            unlinked: false,
            _file: file,
        })
    }

    /// A path that opens the file, while this is alive.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for KeptFile {
    fn drop(&mut self) {
        if !self.unlinked {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl ModelSource {
    /// `onnx` in a temporary file when it is large and one can be written,
    /// else in memory (the bytes shared, not copied).
    pub fn keep(onnx: &Bytes) -> ModelSource {
        if onnx.len() <= IN_FILE_ABOVE {
            return ModelSource::Memory(onnx.clone());
        }
        match KeptFile::write(onnx) {
            Ok(file) => ModelSource::File(file),
            Err(e) => {
                tracing::debug!("keeping the model in memory (no temporary file: {e})");
                ModelSource::Memory(onnx.clone())
            }
        }
    }

    /// The model's bytes (read back from its file when it is in one).
    pub fn bytes(&self) -> Result<Bytes, String> {
        match self {
            ModelSource::Memory(b) => Ok(b.clone()),
            ModelSource::File(file) => std::fs::read(file.path()).map(Bytes::from).map_err(|e| {
                format!(
                    "cannot read the model back from {}: {e}",
                    file.name.display()
                )
            }),
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
        let ModelSource::File(file) = &kept else {
            panic!("a large model is kept in a file where one can be written");
        };
        let path = file.path().to_path_buf();
        assert_eq!(kept.bytes().unwrap(), large);
        // On Linux nothing of it is left by name in the temporary directory,
        // even while it is in use: a killed process leaks no file.
        #[cfg(target_os = "linux")]
        assert!(!file.name.exists(), "{} left by name", file.name.display());
        drop(kept);
        assert!(!path.exists());
    }
}
