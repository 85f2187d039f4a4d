//! Sentence embeddings: what an embedding model brings (its tokenizer and
//! how its token vectors become one), and the pooling itself, pure.
//!
//! A model declared as one (`[models.NAME.embedding]`) takes `input_ids`
//! and `attention_mask` (and `token_type_ids` if it has that input), and
//! gives each token's vector (`[batch, tokens, dims]`); the requester
//! pools them per input: the mean of the tokens the mask keeps, or the
//! first token's (`[CLS]`), then scales each to length 1 when asked, as
//! sentence-transformers' `Pooling` and `Normalize` modules do.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::generate::{join_tokenizer, split_tokenizer, TokenizerTail};

/// How token vectors become one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The mean of the tokens the attention mask keeps.
    #[default]
    Mean,
    /// The first token's (BERT's `[CLS]`).
    Cls,
}

/// What an embedding network brings, read by whoever loads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbeddingSpec {
    /// `tokenizer.json` (Hugging Face tokenizers); on the wire it follows
    /// the model in the load's payload, like a generative network's.
    #[serde(skip)]
    pub tokenizer_json: String,
    /// The tokenizer's length at the end of the payload, bytes.
    pub tokenizer_bytes: u64,
    /// Where the tokenizer is read from, as configured (relative paths as
    /// the model's).
    pub tokenizer_path: String,
    pub pooling: Pooling,
    /// Each vector scaled to length 1.
    pub normalize: bool,
    /// The most tokens one input may have (special tokens included; 0
    /// until the tokenizer is read: its truncation length, else
    /// [`DEFAULT_MAX_LENGTH`]).
    pub max_length: u32,
    /// The output holding the token vectors.
    pub output: String,
}

/// Why an embedding spec or a batch of token vectors is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbeddingError {
    #[error(transparent)]
    Tokenizer(#[from] TokenizerTail),
    #[error("token vectors of shape {shape:?} for {inputs} inputs of {tokens} tokens")]
    Shape {
        shape: Vec<usize>,
        inputs: usize,
        tokens: usize,
    },
}

/// Tokens an input may have unless the config or the tokenizer says.
pub const DEFAULT_MAX_LENGTH: u32 = 512;

impl EmbeddingSpec {
    /// The spec with `tokenizer_json`, the tokenizer it names (an unset
    /// `max_length` taken from the tokenizer's truncation).
    pub fn with_tokenizer(mut self, tokenizer_json: String) -> EmbeddingSpec {
        if self.max_length == 0 {
            self.max_length = truncation_length(&tokenizer_json).unwrap_or(DEFAULT_MAX_LENGTH);
        }
        self.tokenizer_bytes = tokenizer_json.len() as u64;
        self.tokenizer_json = tokenizer_json;
        self
    }

    /// The load's payload: `model`, then the tokenizer (its length noted).
    pub fn join_payload(&mut self, model: &[u8]) -> Bytes {
        self.tokenizer_bytes = self.tokenizer_json.len() as u64;
        join_tokenizer(model, &self.tokenizer_json)
    }

    /// The model of a load's payload; the tokenizer at its end is taken
    /// into the spec.
    pub fn split_payload(&mut self, payload: Bytes) -> Result<Bytes, EmbeddingError> {
        let (model, tokenizer) = split_tokenizer(payload, self.tokenizer_bytes)?;
        self.tokenizer_json = tokenizer;
        Ok(model)
    }

    /// The spec without its tokenizer (what routing tables carry).
    pub fn limits(&self) -> EmbeddingSpec {
        EmbeddingSpec {
            tokenizer_json: String::new(),
            ..self.clone()
        }
    }
}

/// A `tokenizer.json`'s `truncation.max_length`, if it truncates.
fn truncation_length(tokenizer_json: &str) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_str(tokenizer_json).ok()?;
    v["truncation"]["max_length"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
}

/// One vector per input from `hidden`, the token vectors of a batch
/// (`shape`: inputs, tokens, dims), with `mask` (inputs × tokens, 1 where
/// a token is the input's, 0 where padding).
pub fn pool(
    hidden: &[f32],
    shape: &[usize],
    mask: &[i64],
    pooling: Pooling,
    normalize: bool,
) -> Result<Vec<Vec<f32>>, EmbeddingError> {
    let (inputs, tokens) = match shape {
        [n, t, _] => (*n, *t),
        _ => (0, 0),
    };
    let well_shaped = shape.len() == 3
        && mask.len() == inputs * tokens
        && hidden.len() == shape.iter().product::<usize>();
    if !well_shaped {
        return Err(EmbeddingError::Shape {
            shape: shape.to_vec(),
            inputs: mask.len() / tokens.max(1),
            tokens,
        });
    }
    let dims = shape[2];
    let vectors = (0..inputs).map(|i| {
        let rows = &hidden[i * tokens * dims..(i + 1) * tokens * dims];
        let mut v = match pooling {
            Pooling::Cls => rows[..dims].to_vec(),
            Pooling::Mean => mean(rows, &mask[i * tokens..(i + 1) * tokens], dims),
        };
        if normalize {
            scale_to_unit(&mut v);
        }
        v
    });
    Ok(vectors.collect())
}

/// The mean of the rows `mask` keeps (sentence-transformers divides by
/// the kept count, at least 1e-9).
fn mean(rows: &[f32], mask: &[i64], dims: usize) -> Vec<f32> {
    let mut sum = vec![0f32; dims];
    let mut kept = 0f32;
    for (row, &m) in rows.chunks_exact(dims).zip(mask) {
        if m != 0 {
            kept += 1.0;
            for (s, x) in sum.iter_mut().zip(row) {
                *s += x;
            }
        }
    }
    let kept = kept.max(1e-9);
    sum.iter_mut().for_each(|s| *s /= kept);
    sum
}

/// `v / max(|v|, 1e-12)`, as torch's `normalize`.
fn scale_to_unit(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_keeps_only_the_masked_tokens() {
        // Two inputs of up to 3 tokens, 2 dims; the first has 2 tokens.
        let hidden = [1., 2., 3., 4., 100., 100., 1., 1., 1., 1., 4., 7.];
        let mask = [1, 1, 0, 1, 1, 1];
        let v = pool(&hidden, &[2, 3, 2], &mask, Pooling::Mean, false).unwrap();
        assert_eq!(v, vec![vec![2., 3.], vec![2., 3.]]);
        let cls = pool(&hidden, &[2, 3, 2], &mask, Pooling::Cls, false).unwrap();
        assert_eq!(cls, vec![vec![1., 2.], vec![1., 1.]]);
    }

    #[test]
    fn normalized_vectors_have_length_one() {
        let v = pool(&[3., 4.], &[1, 1, 2], &[1], Pooling::Mean, true).unwrap();
        assert_eq!(v, vec![vec![0.6, 0.8]]);
        // A zero vector stays zero rather than dividing by zero.
        let z = pool(&[0., 0.], &[1, 1, 2], &[1], Pooling::Cls, true).unwrap();
        assert_eq!(z, vec![vec![0., 0.]]);
    }

    #[test]
    fn a_shape_that_does_not_match_is_an_error() {
        let e = pool(&[1., 2.], &[1, 2, 2], &[1, 1], Pooling::Mean, false).unwrap_err();
        assert!(matches!(e, EmbeddingError::Shape { .. }), "{e}");
        assert!(pool(&[1.], &[1, 1], &[1], Pooling::Mean, false).is_err());
    }

    #[test]
    fn the_tokenizer_rides_at_the_payload_s_end() {
        let mut spec = EmbeddingSpec {
            tokenizer_json: "{\"model\":{}}".into(),
            ..EmbeddingSpec::default()
        };
        let payload = spec.join_payload(b"onnx");
        let mut received = spec.limits();
        assert_eq!(received.tokenizer_bytes, 12);
        assert_eq!(&received.split_payload(payload).unwrap()[..], b"onnx");
        assert_eq!(received, spec);
        received.tokenizer_bytes = 99;
        assert!(received.split_payload(Bytes::from_static(b"x")).is_err());
    }

    #[test]
    fn an_unset_length_is_the_tokenizer_s_truncation_else_512() {
        let truncating = r#"{"truncation":{"max_length":128}}"#.to_string();
        let spec = EmbeddingSpec::default().with_tokenizer(truncating.clone());
        assert_eq!(spec.max_length, 128);
        assert_eq!(spec.tokenizer_bytes, truncating.len() as u64);
        let plain = EmbeddingSpec::default().with_tokenizer("{}".into());
        assert_eq!(plain.max_length, DEFAULT_MAX_LENGTH);
        let set = EmbeddingSpec {
            max_length: 64,
            ..EmbeddingSpec::default()
        };
        assert_eq!(set.with_tokenizer(truncating).max_length, 64);
    }
}
