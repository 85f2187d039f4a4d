//! A generative model as a path names it: a GGUF file, or a folder in the
//! onnxruntime-genai / Hugging Face layout (`model.onnx` with its external
//! data, `tokenizer.json`, `tokenizer_config.json`, `genai_config.json`).
//! Whoever takes a model by path (the SDK, the coordinator's repository, a
//! front door's load) reads it here: the encoded ONNX model and what a
//! generation needs.

use std::path::Path;

use bytes::Bytes;
use tessera_common::onnx::{FolderError, OnnxError};
use tessera_common::wire::generate::GenerationSpec;

use crate::{cache, is_gguf, BuildOptions, GgufError};

/// A generative model read.
pub struct GenerativeModel {
    /// The encoded ONNX model, weights inline.
    pub model: Bytes,
    pub spec: GenerationSpec,
    /// The model's SHA-256 (hex), remembered by the files it was read
    /// from while they are unchanged (`None` where they cannot be named).
    pub model_sha256: Option<String>,
}

/// Why a generative model cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Folder(#[from] FolderError),
    #[error("{}: {source}", dir.display())]
    Model {
        dir: std::path::PathBuf,
        source: OnnxError,
    },
}

/// Whether `path` names a generative model (a folder or a GGUF file),
/// rather than an ONNX file.
pub fn is_generative(path: &Path) -> bool {
    path.is_dir() || is_gguf(path)
}

/// Reads the generative model at `path`; each copy keeps state for
/// `max_sequences` sequences. A GGUF is built (or taken from the build
/// cache); a folder's `model.onnx` is read with its external data.
pub fn read(path: &Path, max_sequences: u32) -> Result<GenerativeModel, ReadError> {
    read_with(path, max_sequences, &BuildOptions::default())
}

/// [`read`], a GGUF built with `options`.
pub fn read_with(
    path: &Path,
    max_sequences: u32,
    options: &BuildOptions,
) -> Result<GenerativeModel, ReadError> {
    if is_gguf(path) {
        let built = cache::load(path, options, max_sequences)?;
        let identity = cache::file_identity(path)
            .map(|f| format!("gguf model\n{f}\n{options:?}\n{}", cache::BUILDER_VERSION));
        return Ok(GenerativeModel {
            model_sha256: cache::remembered_sha256_of(identity, &built.model),
            model: built.model,
            spec: built.spec,
        });
    }
    let spec = tessera_common::onnx::read_generation_spec(path, max_sequences)?;
    let model = tessera_common::onnx::load_model(path.join("model.onnx")).map_err(|source| {
        ReadError::Model {
            dir: path.to_path_buf(),
            source,
        }
    })?;
    let model: Bytes = tessera_common::onnx::encode_model(&model).into();
    Ok(GenerativeModel {
        model_sha256: cache::remembered_sha256_of(folder_identity(path), &model),
        model,
        spec,
    })
}

/// What a folder's model is made from: every file in it.
fn folder_identity(dir: &Path) -> std::io::Result<String> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let mut identity = String::from("model folder");
    for file in files.iter().filter(|f| f.is_file()) {
        identity.push('\n');
        identity.push_str(&cache::file_identity(file)?);
    }
    Ok(identity)
}
