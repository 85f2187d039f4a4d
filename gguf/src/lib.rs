//! GGUF files as Tessera models.
//!
//! A GGUF (llama.cpp's format: metadata, a vocabulary and quantized
//! tensors in one file) becomes, in memory and in Rust, what a generative
//! model folder gives: an ONNX decoder graph with a KV cache, the
//! tokenizer as a Hugging Face `tokenizer.json`, the chat template and the
//! special tokens ([`GgufModel`]).
//!
//! - [`mod@file`] parses the container over a memory map, checking every
//!   offset; [`types`] lists ggml's tensor types.
//! - [`config`] reads an architecture's hyperparameters from the metadata,
//!   with each family's rules (llama and Mixtral, Qwen 2 and 3,
//!   Qwen2-MoE, Phi-3, Gemma 2 and 3) in one table.
//! - [`quant`] turns each weight type's blocks into onnxruntime's
//!   `MatMulNBits` layouts without a float32 copy.
//! - [`graph`] builds the decoder from onnxruntime's fused operators
//!   (`MatMulNBits`, `GroupQueryAttention` with RoPE inside,
//!   `SkipSimplifiedLayerNormalization`), logits of the last position.
//! - [`vocab`] makes the tokenizer from the GGUF's own vocabulary
//!   (byte-level BPE with its pre-tokenizer, or SentencePiece).
//! - [`folder`] writes the onnxruntime-genai folder (`tessera convert`)
//!   and [`cache`] keeps built models by the file's hash.
//!
//! Why a reader of our own rather than a crate: the format is small (a
//! header, typed key/values, tensor descriptions), the crates that read it
//! either load tensors into their own runtime's types (candle) or copy
//! metadata arrays eagerly, and Tessera needs borrowed slices of one
//! memory map with every length checked against it (a garbled file is an
//! error, never a panic or an allocation the file does not back).

pub mod cache;
pub mod config;
pub mod file;
pub mod folder;
pub mod generative;
pub mod graph;
pub mod kernels;
pub mod model;
pub mod pages;
pub mod quant;
pub mod types;
pub mod vocab;

#[cfg(test)]
pub(crate) mod testing;

pub use model::{BuildOptions, GgufModel};

/// What is wrong with a GGUF file, named in one line.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file (it does not start with 'GGUF')")]
    NotGguf,
    #[error("the GGUF file is truncated: {0}")]
    Truncated(String),
    #[error("unsupported GGUF: {0}")]
    Unsupported(String),
    #[error("GGUF metadata {key}: {reason}")]
    Metadata { key: String, reason: String },
    #[error("GGUF metadata has no {0}")]
    MissingKey(String),
    #[error("GGUF tensor {name}: {reason}")]
    Tensor { name: String, reason: String },
    #[error("GGUF architecture '{0}' is not supported (these are: {names})", names = config::family::names())]
    Architecture(String),
    #[error("GGUF vocabulary: {0}")]
    Vocabulary(String),
}

/// Whether `path` is a GGUF file: a file that starts with the format's
/// magic (whatever its name: model stores such as ollama's keep GGUFs
/// under their hashes).
pub fn is_gguf(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == b"GGUF")
}
