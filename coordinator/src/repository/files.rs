//! Reading a named model's files: its ONNX bytes, or for a generative
//! model (a GGUF file or a model folder) the model its files make and what
//! they say of generation; an embedding model's tokenizer.

use bytes::Bytes;
use tessera_common::wire::embed::EmbeddingSpec;
use tessera_common::wire::generate::GenerationSpec;

use super::registry::Source;
use crate::CoordinatorError;

/// A source's model bytes.
pub(crate) async fn read(source: &Source) -> Result<Bytes, CoordinatorError> {
    read_with_spec(source, 1).await.map(|(bytes, _)| bytes)
}

/// A source's model bytes and, for a generative model read from its path
/// (a GGUF file or a model folder), what its files say of generation;
/// each copy to keep state for `max_sequences` sequences.
pub(super) async fn read_with_spec(
    source: &Source,
    max_sequences: u32,
) -> Result<(Bytes, Option<GenerationSpec>), CoordinatorError> {
    let path = match source {
        Source::Bytes(sent) if sent.lacking => {
            return Err(CoordinatorError::Model(format!(
                "the model's bytes (sha-256 {}) are not on this coordinator: it was restored \
                 without them and takes them back from the workers; send them again to load it",
                sent.sha256()
            )))
        }
        Source::Bytes(sent) => return Ok((sent.bytes.clone(), None)),
        Source::File(path) => path.clone(),
    };
    tokio::task::spawn_blocking(move || {
        if tessera_gguf::generative::is_generative(&path) {
            let read = tessera_gguf::generative::read(&path, max_sequences)
                .map_err(|e| CoordinatorError::Model(e.to_string()))?;
            return Ok((read.model, Some(read.spec)));
        }
        std::fs::read(&path)
            .map(|b| (Bytes::from(b), None))
            .map_err(|e| CoordinatorError::Model(format!("cannot read {}: {e}", path.display())))
    })
    .await
    .map_err(|e| CoordinatorError::Model(e.to_string()))?
}

/// An embedding spec with its tokenizer, read from its path unless it
/// came with it.
pub(super) async fn with_embedding_tokenizer(
    spec: EmbeddingSpec,
) -> Result<EmbeddingSpec, CoordinatorError> {
    if !spec.tokenizer_json.is_empty() {
        return Ok(spec);
    }
    let path = spec.tokenizer_path.clone();
    let read = tokio::task::spawn_blocking(move || std::fs::read_to_string(&path))
        .await
        .map_err(|e| CoordinatorError::Model(e.to_string()))?;
    let json = read.map_err(|e| {
        CoordinatorError::Model(format!(
            "cannot read the embedding tokenizer {}: {e}",
            spec.tokenizer_path
        ))
    })?;
    Ok(spec.with_tokenizer(json))
}
