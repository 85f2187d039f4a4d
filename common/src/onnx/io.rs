//! Decoding, encoding and external-data resolution of `ModelProto`s.
//!
//! `common` does no I/O on the hot path, but reading a model file (and its
//! external-data files) is the one place where a path is the natural input.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use prost::Message;

use super::proto::{tensor_proto::DataLocation, GraphProto, ModelProto, TensorProto};
use super::OnnxError;

/// What to do with initializers whose bytes live in external files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExternalDataPolicy {
    /// Read the external files and inline the bytes into `raw_data`.
    Inline,
    /// Leave external references as they are.
    Keep,
}

/// Decodes a model from protobuf bytes. External data is left as references.
pub fn decode_model(bytes: &[u8]) -> Result<ModelProto, OnnxError> {
    let model = ModelProto::decode(bytes).map_err(|source| OnnxError::Decode {
        len: bytes.len(),
        source,
    })?;
    check_is_model(&model)?;
    Ok(model)
}

/// Decodes a model from a shared buffer: its initializers' bytes are
/// slices of `bytes`, not copies (a model of weights held once).
pub fn decode_model_shared(bytes: bytes::Bytes) -> Result<ModelProto, OnnxError> {
    let len = bytes.len();
    let model = ModelProto::decode(bytes).map_err(|source| OnnxError::Decode { len, source })?;
    check_is_model(&model)?;
    Ok(model)
}

/// Encodes a model to protobuf bytes.
pub fn encode_model(model: &ModelProto) -> Vec<u8> {
    model.encode_to_vec()
}

/// Reads a model file and inlines any external data found next to it.
pub fn load_model(path: impl AsRef<Path>) -> Result<ModelProto, OnnxError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| OnnxError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let mut model = decode_model_shared(bytes.into())?;
    let base = path.parent().unwrap_or(Path::new("."));
    load_model_with_base_dir(&mut model, base, ExternalDataPolicy::Inline)?;
    Ok(model)
}

/// Why a generative model folder cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    #[error("{}: cannot read {file}: {source}", dir.display())]
    Read {
        dir: std::path::PathBuf,
        file: &'static str,
        source: std::io::Error,
    },
    #[error("{}: no tokenizer.json: a generative model needs its tokenizer", .0.display())]
    NoTokenizer(std::path::PathBuf),
    #[error("{}: {source}", dir.display())]
    Spec {
        dir: std::path::PathBuf,
        source: crate::wire::generate::GenerationError,
    },
}

/// A generative model folder's tokenizer, chat template and limits (the
/// Hugging Face / onnxruntime-genai layout: `tokenizer.json`, and where
/// present `tokenizer_config.json` and `genai_config.json`), each stage
/// to keep state for `max_sequences` sequences.
pub fn read_generation_spec(
    dir: &Path,
    max_sequences: u32,
) -> Result<crate::wire::generate::GenerationSpec, FolderError> {
    use crate::wire::generate::{FolderFiles, GenerationSpec};
    let text = |file: &'static str| match std::fs::read_to_string(dir.join(file)) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FolderError::Read {
            dir: dir.to_path_buf(),
            file,
            source,
        }),
    };
    let tokenizer_json =
        text("tokenizer.json")?.ok_or_else(|| FolderError::NoTokenizer(dir.to_path_buf()))?;
    let (tokenizer_config, genai_config) =
        (text("tokenizer_config.json")?, text("genai_config.json")?);
    let files = FolderFiles {
        tokenizer_json: &tokenizer_json,
        tokenizer_config: tokenizer_config.as_deref(),
        genai_config: genai_config.as_deref(),
    };
    GenerationSpec::from_files(&files, max_sequences).map_err(|source| FolderError::Spec {
        dir: dir.to_path_buf(),
        source,
    })
}

/// Resolves external data of `model` relative to `base_dir` (the folder of the
/// model file) according to `policy`.
pub fn load_model_with_base_dir(
    model: &mut ModelProto,
    base_dir: &Path,
    policy: ExternalDataPolicy,
) -> Result<(), OnnxError> {
    if policy == ExternalDataPolicy::Keep {
        return Ok(());
    }
    if let Some(graph) = model.graph.as_mut() {
        inline_graph(graph, base_dir, &mut HashMap::new())?;
    }
    Ok(())
}

/// Writes a model to a file (external data stays as it is in the model).
pub fn save_model(model: &ModelProto, path: impl AsRef<Path>) -> Result<(), OnnxError> {
    let path = path.as_ref();
    std::fs::write(path, encode_model(model)).map_err(|source| OnnxError::Write {
        path: path.display().to_string(),
        source,
    })
}

fn check_is_model(model: &ModelProto) -> Result<(), OnnxError> {
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| OnnxError::Invalid("the model has no graph".into()))?;
    if model.opset_import.is_empty() && model.ir_version.unwrap_or(0) >= 3 {
        return Err(OnnxError::Invalid(
            "the model declares no opset_import".into(),
        ));
    }
    if graph.node.is_empty() && graph.output.is_empty() {
        return Err(OnnxError::Invalid(
            "the graph has neither nodes nor outputs".into(),
        ));
    }
    Ok(())
}

/// Contents of the external files read so far, so each is read once.
/// (Each initializer's bytes are a slice of its file's: read once, shared.)
type FileCache = HashMap<PathBuf, bytes::Bytes>;

fn inline_graph(
    graph: &mut GraphProto,
    base_dir: &Path,
    files: &mut FileCache,
) -> Result<(), OnnxError> {
    for tensor in graph.initializer.iter_mut() {
        inline_tensor(tensor, base_dir, files)?;
    }
    for sparse in graph.sparse_initializer.iter_mut() {
        if let Some(t) = sparse.values.as_mut() {
            inline_tensor(t, base_dir, files)?;
        }
        if let Some(t) = sparse.indices.as_mut() {
            inline_tensor(t, base_dir, files)?;
        }
    }
    for node in graph.node.iter_mut() {
        for attr in node.attribute.iter_mut() {
            if let Some(t) = attr.t.as_mut() {
                inline_tensor(t, base_dir, files)?;
            }
            for t in attr.tensors.iter_mut() {
                inline_tensor(t, base_dir, files)?;
            }
            if let Some(g) = attr.g.as_mut() {
                inline_graph(g, base_dir, files)?;
            }
            for g in attr.graphs.iter_mut() {
                inline_graph(g, base_dir, files)?;
            }
        }
    }
    Ok(())
}

fn inline_tensor(
    tensor: &mut TensorProto,
    base_dir: &Path,
    files: &mut FileCache,
) -> Result<(), OnnxError> {
    if tensor.data_location != Some(DataLocation::External as i32) {
        return Ok(());
    }
    let name = tensor.name.clone().unwrap_or_default();
    let err = |message: String| OnnxError::ExternalData {
        tensor: name.clone(),
        message,
    };
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for entry in &tensor.external_data {
        let value = entry.value.as_deref().unwrap_or("");
        match entry.key.as_deref().unwrap_or("") {
            "location" => location = Some(value.to_string()),
            "offset" => {
                offset = value
                    .parse()
                    .map_err(|_| err(format!("offset '{value}' is not a number")))?
            }
            "length" => {
                length = Some(
                    value
                        .parse::<u64>()
                        .map_err(|_| err(format!("length '{value}' is not a number")))?,
                )
            }
            _ => {}
        }
    }
    let location = location.ok_or_else(|| err("no 'location' key".into()))?;
    let rel = Path::new(&location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(err(format!(
            "location '{location}' must be a relative path inside the model's folder"
        )));
    }
    let path = base_dir.join(rel);
    if !files.contains_key(&path) {
        let bytes = std::fs::read(&path).map_err(|source| OnnxError::ExternalDataRead {
            tensor: name.clone(),
            path: path.clone(),
            source,
        })?;
        files.insert(path.clone(), bytes::Bytes::from(bytes));
    }
    let data = &files[&path];
    let start = usize::try_from(offset).map_err(|_| err("offset too large".into()))?;
    let end = match length {
        Some(len) => start.checked_add(len as usize),
        None => Some(data.len()),
    }
    .filter(|&end| end <= data.len() && start <= end)
    .ok_or_else(|| {
        err(format!(
            "range offset {offset} length {length:?} is outside {} ({} bytes)",
            path.display(),
            data.len()
        ))
    })?;
    tensor.raw_data = Some(data.slice(start..end));
    tensor.external_data.clear();
    tensor.data_location = Some(DataLocation::Default as i32);
    Ok(())
}
