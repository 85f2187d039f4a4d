//! Sentence embeddings at the requester: inputs (text, or token ids as
//! they are) tokenized with the network's tokenizer, padded into one
//! request (`input_ids`, `attention_mask`, `token_type_ids` where the
//! model takes it), run like any request (dynamic batching included), and
//! the token vectors pooled per input
//! ([`tessera_common::wire::embed::pool`]).

use std::sync::Arc;

use tessera_common::tensor::Tensor;
use tessera_common::wire::client::{ClientReply, ClientRequest};
use tessera_common::wire::control::ErrorKind;
use tessera_common::wire::embed::{pool, EmbeddingSpec};
use tessera_common::wire::routes::Signature;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::{ClientError, Network, Operation};

/// The most inputs one request may embed (OpenAI's bound).
pub const MAX_INPUTS: usize = 2048;

/// One input to embed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmbedInput {
    /// Text, tokenized with the special tokens the model expects.
    Text(String),
    /// Token ids, fed as they are.
    Ids(Vec<u32>),
}

/// What an over-long input gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Truncate {
    /// Refused (400).
    #[default]
    No,
    /// Cut to the model's length.
    ToModel,
    /// Cut to this many tokens (at most the model's).
    To(u32),
}

/// Vectors, one per input, and the tokens they took.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    pub tokens: usize,
}

/// A request's inputs, padded: the tensors to run and the mask to pool
/// with.
pub struct Batch {
    pub inputs: Vec<(String, Tensor)>,
    /// Inputs × tokens: 1 for an input's token, 0 for padding.
    pub mask: Vec<i64>,
    /// Tokens over every input (padding left out).
    pub tokens: usize,
}

/// One input's token ids and token types.
type Tokens = (Vec<u32>, Vec<u32>);

/// An embedding network at its requester: its tokenizer (no padding,
/// truncation as asked) and spec.
pub struct Embedder {
    tokenizer: Tokenizer,
    /// The tokenizer cutting inputs to the model's length.
    truncating: Tokenizer,
    /// Its vocabulary's size, added tokens included (counted once: the
    /// tokenizer counts by building the whole vocabulary).
    vocabulary: usize,
    pub spec: EmbeddingSpec,
}

fn failed(kind: ErrorKind, message: impl Into<String>) -> ClientError {
    ClientError::Failed {
        op: Operation::Embed,
        kind,
        message: message.into(),
    }
}

fn bad(message: impl Into<String>) -> ClientError {
    failed(ErrorKind::BadInput, message)
}

impl Embedder {
    pub fn new(spec: EmbeddingSpec) -> Result<Embedder, ClientError> {
        let mut tokenizer = Tokenizer::from_bytes(spec.tokenizer_json.as_bytes())
            .map_err(|e| failed(ErrorKind::Internal, format!("the tokenizer: {e}")))?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| failed(ErrorKind::Internal, format!("the tokenizer: {e}")))?;
        let truncating = truncating(&tokenizer, spec.max_length as usize)?;
        let vocabulary = tokenizer.get_vocab_size(true);
        Ok(Embedder {
            tokenizer,
            truncating,
            vocabulary,
            spec,
        })
    }

    /// Each input's token ids (and token types), within the length allowed.
    fn tokenized(
        &self,
        inputs: &[EmbedInput],
        truncate: Truncate,
    ) -> Result<Vec<Tokens>, ClientError> {
        let most = self.spec.max_length as usize;
        let limit = match truncate {
            Truncate::No => None,
            Truncate::ToModel => Some(most),
            Truncate::To(n) => Some((n as usize).min(most)),
        };
        let cut;
        let tokenizer = match limit {
            None => &self.tokenizer,
            Some(n) if n == most => &self.truncating,
            Some(n) => {
                cut = truncating(&self.tokenizer, n)?;
                &cut
            }
        };
        let vocabulary = self.vocabulary;
        inputs
            .iter()
            .enumerate()
            .map(|(i, input)| {
                let (ids, types) = match input {
                    EmbedInput::Text(text) => {
                        let e = tokenizer
                            .encode(text.as_str(), true)
                            .map_err(|e| bad(format!("input {i}: {e}")))?;
                        (e.get_ids().to_vec(), e.get_type_ids().to_vec())
                    }
                    EmbedInput::Ids(ids) => {
                        if let Some(id) = ids.iter().find(|&&id| id as usize >= vocabulary) {
                            return Err(bad(format!(
                                "input {i}: token {id} is not in the vocabulary of {vocabulary}"
                            )));
                        }
                        let kept = &ids[..limit.map_or(ids.len(), |n| n.min(ids.len()))];
                        (kept.to_vec(), vec![0; kept.len()])
                    }
                };
                if ids.is_empty() {
                    return Err(bad(format!("input {i} has no tokens")));
                }
                if ids.len() > most {
                    return Err(bad(format!(
                        "input {i} has {} tokens, beyond the model's {most} (ask for truncation to cut it)",
                        ids.len()
                    )));
                }
                Ok((ids, types))
            })
            .collect()
    }

    /// The inputs as one padded request to a model of `signature`.
    pub fn batch(
        &self,
        inputs: &[EmbedInput],
        truncate: Truncate,
        signature: &Signature,
    ) -> Result<Batch, ClientError> {
        if inputs.is_empty() {
            return Err(bad("no input to embed"));
        }
        if inputs.len() > MAX_INPUTS {
            return Err(bad(format!(
                "{} inputs: at most {MAX_INPUTS} a request",
                inputs.len()
            )));
        }
        let tokenized = self.tokenized(inputs, truncate)?;
        let width = tokenized
            .iter()
            .map(|(ids, _)| ids.len())
            .max()
            .unwrap_or(0);
        let rows = tokenized.len();
        let (mut ids, mut types, mut mask) = (
            vec![0i64; rows * width],
            vec![0i64; rows * width],
            vec![0i64; rows * width],
        );
        for (r, (row_ids, row_types)) in tokenized.iter().enumerate() {
            for (t, (&id, &ty)) in row_ids.iter().zip(row_types).enumerate() {
                ids[r * width + t] = i64::from(id);
                types[r * width + t] = i64::from(ty);
                mask[r * width + t] = 1;
            }
        }
        let tokens = tokenized.iter().map(|(ids, _)| ids.len()).sum();
        let tensor = |values: &[i64]| {
            Tensor::from_values(vec![rows, width], values)
                .map_err(|e| failed(ErrorKind::Internal, e.to_string()))
        };
        let mut tensors = Vec::new();
        for input in &signature.inputs {
            let values = match input.name.as_str() {
                "input_ids" => &ids,
                "attention_mask" => &mask,
                "token_type_ids" => &types,
                other => {
                    return Err(bad(format!(
                        "the model's input '{other}' is not one an embedding takes"
                    )))
                }
            };
            tensors.push((input.name.clone(), tensor(values)?));
        }
        Ok(Batch {
            inputs: tensors,
            mask,
            tokens,
        })
    }

    /// The vectors of a batch (its `mask`) from the token vectors the
    /// model gave.
    pub fn pooled(&self, mask: &[i64], hidden: &Tensor) -> Result<Vec<Vec<f32>>, ClientError> {
        let values = hidden.float_values().ok_or_else(|| {
            failed(
                ErrorKind::Internal,
                format!("output '{}' is not float", self.spec.output),
            )
        })?;
        pool(
            &values,
            hidden.shape(),
            mask,
            self.spec.pooling,
            self.spec.normalize,
        )
        .map_err(|e| failed(ErrorKind::Internal, e.to_string()))
    }
}

/// `tokenizer` cutting inputs to `n` tokens at their end, special tokens
/// kept.
fn truncating(tokenizer: &Tokenizer, n: usize) -> Result<Tokenizer, ClientError> {
    let mut t = tokenizer.clone();
    t.with_truncation(Some(TruncationParams {
        max_length: n,
        strategy: TruncationStrategy::LongestFirst,
        stride: 0,
        direction: TruncationDirection::Right,
    }))
    .map_err(|e| bad(format!("truncation to {n} tokens: {e}")))?;
    Ok(t)
}

impl Network {
    /// This network's embedder (its tokenizer fetched from the
    /// coordinator once).
    pub async fn embedder(&self) -> Result<Arc<Embedder>, ClientError> {
        self.embedder
            .get_or_try_init(|| async {
                let table = self
                    .routes
                    .table()
                    .ok_or_else(|| failed(ErrorKind::Unavailable, "no routing table"))?;
                if table.embedding.is_none() {
                    return Err(bad(format!("model '{}' does not embed", table.name)));
                }
                let spec = self.client.embedding_spec(table.network).await?;
                Ok(Arc::new(Embedder::new(spec)?))
            })
            .await
            .cloned()
    }

    /// The inputs' vectors, one each, in order.
    pub async fn embed(
        &self,
        inputs: &[EmbedInput],
        truncate: Truncate,
    ) -> Result<Embeddings, ClientError> {
        let embedder = self.embedder().await?;
        let table = self
            .routes
            .table()
            .ok_or_else(|| failed(ErrorKind::Unavailable, "no routing table"))?;
        let batch = embedder.batch(inputs, truncate, &table.signature)?;
        let mut outputs = self.infer(batch.inputs).await?;
        let at = outputs
            .tensors
            .iter()
            .position(|(name, _)| *name == embedder.spec.output)
            .ok_or_else(|| failed(ErrorKind::Internal, "no token vectors came back"))?;
        let (_, hidden) = outputs.tensors.swap_remove(at);
        Ok(Embeddings {
            vectors: embedder.pooled(&batch.mask, &hidden)?,
            tokens: batch.tokens,
        })
    }
}

impl crate::Client {
    /// An embedding network's spec and tokenizer.
    pub(crate) async fn embedding_spec(&self, network: u64) -> Result<EmbeddingSpec, ClientError> {
        let msg = ClientRequest::Embedding { network };
        match self.ask_with_payload(Operation::Embed, &msg).await? {
            (ClientReply::Embedding(spec), payload) => {
                let mut spec = *spec;
                spec.split_payload(payload)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                Ok(spec)
            }
            (other, _) => Err(ClientError::unexpected(Operation::Embed, &other)),
        }
    }
}
