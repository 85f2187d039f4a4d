//! Where a compiled subgraph keeps its model between sessions: in memory,
//! or, for a large one, in a private temporary folder as ONNX lays out
//! external data (`model.onnx` and its weights in `weights.bin`), which
//! its sessions are built from. onnxruntime maps a model file's external
//! data instead of copying it onto its heap, so a worker holds a stage's
//! weights once, as pages of that file the kernel may drop and read back
//! (built from the bytes in memory, a session held them twice while it
//! parsed the model, then once on its heap). A stage from the compile
//! cache is kept so without writing its weights again: its folder is made
//! beside the cache's file, `weights.bin` a hard link to that file, each
//! weight external data where it already is in it. The model is read back
//! whole only to export the subgraph.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use tessera_common::onnx::external::{external_in_place, inline_weights, with_external_weights};
use tessera_common::onnx::parts::encode_parts;
use tessera_common::onnx::proto::ModelProto;
use tessera_common::onnx::{decode_model_shared, encode_model};

/// Models larger than this are kept in a folder.
const IN_FILE_ABOVE: usize = 16 << 20;
/// Initializers at least this large go to the folder's weights file.
const EXTERNAL_FROM: usize = 4096;
/// The weights file's name in a folder.
const WEIGHTS: &str = "weights.bin";
/// The folders' names start with this, then the process id.
const PREFIX: &str = "tessera-ort-model-";

/// A compiled subgraph's model.
pub(super) enum ModelSource {
    Memory(Bytes),
    Folder(KeptFolder),
}

/// A temporary folder of this process holding a model and its weights,
/// removed when dropped. A process killed before leaves its folders
/// behind: the next one to keep a model removes those of processes that
/// are gone.
pub(super) struct KeptFolder {
    dir: PathBuf,
    model: PathBuf,
}

impl KeptFolder {
    /// Writes `model` to a new folder in the temporary directory, its
    /// large initializers as external data (their bytes written, not
    /// copied).
    fn write(model: &ModelProto) -> std::io::Result<KeptFolder> {
        let kept = KeptFolder::new_in(&std::env::temp_dir(), "")?;
        let split = with_external_weights(model, WEIGHTS, EXTERNAL_FROM);
        let mut weights = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(kept.dir.join(WEIGHTS))?;
        for piece in &split.data {
            std::io::Write::write_all(&mut weights, piece)?;
        }
        std::fs::write(&kept.model, encode_model(&split.model))?;
        tracing::debug!(
            weights = split.moved,
            dir = %kept.dir.display(),
            "the model kept with its weights as external data"
        );
        Ok(kept)
    }

    /// A new folder in `parent`, its name `hidden` (a dot) then this
    /// process's: a new one only, never one that is there, nor a link's
    /// target. The first in each parent removes those of processes gone.
    fn new_in(parent: &Path, hidden: &str) -> std::io::Result<KeptFolder> {
        static FOLDERS: AtomicU64 = AtomicU64::new(0);
        static SWEPT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
        if let Ok(mut swept) = SWEPT.lock() {
            if !swept.iter().any(|p| p == parent) {
                swept.push(parent.to_path_buf());
                remove_left_behind(parent, hidden);
            }
        }
        let dir = parent.join(format!(
            "{hidden}{PREFIX}{}-{}",
            std::process::id(),
            FOLDERS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir)?;
        Ok(KeptFolder {
            model: dir.join("model.onnx"),
            dir,
        })
    }

    /// `model` (decoded from `base`, the whole of `file` mapped) kept in a
    /// new folder beside `file`: its weights file a hard link to `file`,
    /// its large initializers external data where they are in it.
    fn link(model: &ModelProto, (file, base): (&Path, &Bytes)) -> std::io::Result<KeptFolder> {
        let parent = file.parent().unwrap_or(Path::new("."));
        let kept = KeptFolder::new_in(parent, ".")?;
        std::fs::hard_link(file, kept.dir.join(WEIGHTS))?;
        let (frames, moved) = external_in_place(model, WEIGHTS, base, EXTERNAL_FROM);
        std::fs::write(&kept.model, encode_model(&frames))?;
        tracing::debug!(weights = moved, dir = %kept.dir.display(), "the model's weights linked where they are");
        Ok(kept)
    }

    /// The model's encoding with its weights inline, as pieces.
    fn read_back(&self) -> Result<Vec<Bytes>, String> {
        let frames = std::fs::read(&self.model).map_err(|e| e.to_string())?;
        let mut model = decode_model_shared(Bytes::from(frames)).map_err(|e| e.to_string())?;
        // This folder's file, written (or linked) once and never changed
        // while the folder is kept.
        let file = std::fs::File::open(self.dir.join(WEIGHTS)).map_err(|e| e.to_string())?;
        let weights = tessera_gguf::pages::map(&file).map_err(|e| e.to_string())?;
        inline_weights(&mut model, WEIGHTS, &weights).map_err(|e| e.to_string())?;
        Ok(encode_parts(&model))
    }

    /// The model file (its weights beside it), while this is alive.
    pub fn model(&self) -> &Path {
        &self.model
    }
}

impl Drop for KeptFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Removes the kept folders in `parent` (named `hidden` then [`PREFIX`])
/// of processes that are gone (Linux: no `/proc/PID`).
fn remove_left_behind(parent: &Path, hidden: &str) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let prefix = format!("{hidden}{PREFIX}");
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid.filter(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            tracing::debug!(
                pid,
                "removing a model folder left by a process that is gone"
            );
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl ModelSource {
    /// `model` (decoded from `onnx`) in a temporary folder when it is
    /// large and one can be written, else in memory (the bytes shared, not
    /// copied).
    pub fn keep(model: &ModelProto, onnx: &Bytes) -> ModelSource {
        ModelSource::large_in_folder(onnx, || KeptFolder::write(model))
    }

    /// `model` (decoded from `onnx`, a slice of `base`, the whole of
    /// `file` mapped) in a folder beside `file` when it is large, its
    /// weights left where they are in `file`; else, or when no folder can
    /// be made there, in memory (the bytes shared).
    pub fn linked(model: &ModelProto, onnx: &Bytes, file: (&Path, &Bytes)) -> ModelSource {
        ModelSource::large_in_folder(onnx, || KeptFolder::link(model, file))
    }

    /// A large `onnx` in the folder `make` makes; a small one, or one no
    /// folder could be made for, in memory.
    fn large_in_folder(
        onnx: &Bytes,
        make: impl FnOnce() -> std::io::Result<KeptFolder>,
    ) -> ModelSource {
        if onnx.len() <= IN_FILE_ABOVE {
            return ModelSource::Memory(onnx.clone());
        }
        match make() {
            Ok(folder) => ModelSource::Folder(folder),
            Err(e) => {
                tracing::debug!("keeping the model in memory (no folder for it: {e})");
                ModelSource::Memory(onnx.clone())
            }
        }
    }

    /// The model's encoding, its weights inline, as pieces: the bytes
    /// kept, or read back from its folder (the weights as slices of their
    /// file mapped, not copied).
    pub fn pieces(&self) -> Result<Vec<Bytes>, String> {
        match self {
            ModelSource::Memory(b) => Ok(vec![b.clone()]),
            ModelSource::Folder(folder) => folder
                .read_back()
                .map_err(|e| format!("cannot read the model back: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_common::onnx::proto::{GraphProto, NodeProto, TensorProto, ValueInfoProto};

    fn large_model() -> Bytes {
        let weight = TensorProto {
            name: Some("w".into()),
            dims: vec![IN_FILE_ABOVE as i64 + 1],
            data_type: Some(2),
            raw_data: Some(Bytes::from(vec![9u8; IN_FILE_ABOVE + 1])),
            ..Default::default()
        };
        let model = ModelProto {
            ir_version: Some(8),
            opset_import: vec![Default::default()],
            graph: Some(GraphProto {
                node: vec![NodeProto {
                    op_type: Some("Identity".into()),
                    input: vec!["w".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                }],
                initializer: vec![weight],
                output: vec![ValueInfoProto {
                    name: Some("y".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        Bytes::from(encode_model(&model))
    }

    #[test]
    fn a_large_model_waits_in_a_folder_until_dropped() {
        let small = Bytes::from(vec![7u8; 1024]);
        let empty = ModelProto::default();
        assert!(matches!(
            ModelSource::keep(&empty, &small),
            ModelSource::Memory(_)
        ));
        let large = large_model();
        let model = decode_model_shared(large.clone()).unwrap();
        let kept = ModelSource::keep(&model, &large);
        let ModelSource::Folder(folder) = &kept else {
            panic!("a large model is kept in a folder where one can be written");
        };
        let dir = folder.dir.clone();
        // The model file is small: its weight is in the file beside it.
        assert!(std::fs::metadata(folder.model()).unwrap().len() < 1024);
        assert_eq!(
            std::fs::metadata(dir.join("weights.bin")).unwrap().len(),
            IN_FILE_ABOVE as u64 + 1
        );
        let whole: Vec<u8> = kept.pieces().unwrap().concat();
        let back = decode_model_shared(Bytes::from(whole)).unwrap();
        let weight = |m: &ModelProto| m.graph.as_ref().unwrap().initializer[0].raw_data.clone();
        assert_eq!(weight(&back), weight(&model));
        assert_eq!(
            back.graph.as_ref().unwrap().node,
            model.graph.as_ref().unwrap().node
        );
        drop(kept);
        assert!(!dir.exists());
    }

    #[test]
    fn a_large_model_in_a_file_is_linked_beside_it_not_written_again() {
        let dir = std::env::temp_dir().join(format!("tessera-link-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A file with a header before the model, as the compile cache's.
        let file = dir.join("key.blob");
        let mut contents = b"HEADER".to_vec();
        contents.extend_from_slice(&large_model());
        std::fs::write(&file, &contents).unwrap();
        let base = Bytes::from(contents);
        let onnx = base.slice(6..);
        let model = decode_model_shared(onnx.clone()).unwrap();
        let kept = ModelSource::linked(&model, &onnx, (&file, &base));
        let ModelSource::Folder(folder) = &kept else {
            panic!("a large model in a file is kept in a folder beside it");
        };
        assert_eq!(folder.dir.parent(), Some(dir.as_path()));
        assert!(std::fs::metadata(folder.model()).unwrap().len() < 1024);
        // The weights file is the cache's file itself, not a copy.
        use std::os::unix::fs::MetadataExt;
        let inode = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(inode(&folder.dir.join(WEIGHTS)), inode(&file));
        let whole: Vec<u8> = kept.pieces().unwrap().concat();
        let back = decode_model_shared(Bytes::from(whole)).unwrap();
        let weight = |m: &ModelProto| m.graph.as_ref().unwrap().initializer[0].raw_data.clone();
        assert_eq!(weight(&back), weight(&model));
        // The cache may drop its file meanwhile: the link keeps the data.
        std::fs::remove_file(&file).unwrap();
        let again = decode_model_shared(Bytes::from(kept.pieces().unwrap().concat())).unwrap();
        assert_eq!(weight(&again), weight(&model));
        let folder_dir = folder.dir.clone();
        drop(kept);
        assert!(!folder_dir.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn folders_of_processes_that_are_gone_are_removed_and_others_kept() {
        let tmp = std::env::temp_dir().join(format!("tessera-sweep-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let gone = tmp.join(format!("{PREFIX}{}-0", u32::MAX - 1));
        let alive = tmp.join(format!("{PREFIX}{}-0", std::process::id()));
        let other = tmp.join("tessera-other-1");
        for d in [&gone, &alive, &other] {
            std::fs::create_dir_all(d).unwrap();
        }
        remove_left_behind(&tmp, "");
        assert!(!gone.exists());
        assert!(alive.exists() && other.exists());
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
