//! `POST /v1/embeddings` on the models declared as sentence-embedding ones
//! (`[models.NAME.embedding]`), as OpenAI answers it:
//!
//! - `input`: a string, a list of strings, a list of token ids or a list
//!   of such lists (ids are fed as they are); at most 2,048 inputs;
//! - `encoding_format`: `float` (default) or `base64` (little-endian
//!   float32, what the `openai` Python client asks for and decodes);
//! - an input longer than the model's `max_length` is refused (400)
//!   unless `truncate: true` (TEI's) or `truncate_prompt_tokens: N`
//!   (vLLM's) cuts it, at its end, special tokens kept;
//! - `dimensions` other than the model's is refused.
//!
//! The inputs go as one padded request, through the same dynamic
//! batching, retries and metrics as any request; `usage` counts their
//! tokens.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use tessera_client::embed::{EmbedInput, Truncate};

use super::openai::{bad, OpenAiError};
use crate::Door;

#[derive(Deserialize)]
struct EmbeddingRequest {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
    #[serde(default)]
    truncate: bool,
    #[serde(default)]
    truncate_prompt_tokens: Option<u32>,
    #[allow(dead_code)]
    #[serde(default)]
    user: Option<String>,
}

/// `input` as a list of inputs.
fn inputs(input: &Value) -> Result<Vec<EmbedInput>, OpenAiError> {
    let ids = |items: &[Value]| -> Option<Vec<u32>> {
        items
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()
    };
    let malformed = || {
        bad("input must be a string, a list of strings, a list of token ids or a list of such lists")
    };
    match input {
        Value::String(s) => Ok(vec![EmbedInput::Text(s.clone())]),
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_number) => {
            Ok(vec![EmbedInput::Ids(ids(items).ok_or_else(malformed)?)])
        }
        Value::Array(items) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(EmbedInput::Text(s.clone())),
                Value::Array(list) => Ok(EmbedInput::Ids(ids(list).ok_or_else(malformed)?)),
                _ => Err(malformed()),
            })
            .collect(),
        _ => Err(malformed()),
    }
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(door): State<Arc<Door>>,
    body: Bytes,
) -> Result<Json<Value>, OpenAiError> {
    let request: EmbeddingRequest = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("malformed embedding request: {e}")))?;
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => return Err(bad(format!("encoding_format '{other}': float or base64"))),
    };
    let truncate = match (request.truncate_prompt_tokens, request.truncate) {
        (Some(0), _) => return Err(bad("truncate_prompt_tokens must be at least 1")),
        (Some(n), _) => Truncate::To(n),
        (None, true) => Truncate::ToModel,
        (None, false) => Truncate::No,
    };
    let inputs = inputs(&request.input)?;
    let done = door.embed(&request.model, &inputs, truncate).await?;
    let dims = done.vectors.first().map_or(0, Vec::len);
    if let Some(d) = request.dimensions.filter(|&d| d != dims) {
        return Err(bad(format!(
            "dimensions {d}: model {} gives {dims}",
            request.model
        )));
    }
    let data: Vec<Value> = done
        .vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match base64 {
                true => json!(encode(v)),
                false => json!(v),
            };
            json!({ "object": "embedding", "index": index, "embedding": embedding })
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": { "prompt_tokens": done.tokens, "total_tokens": done.tokens },
    })))
}

/// A vector as base64 of its little-endian float32 bytes.
fn encode(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_of_input_is_taken() {
        let one = inputs(&json!("hi")).unwrap();
        assert_eq!(one, vec![EmbedInput::Text("hi".into())]);
        let texts = inputs(&json!(["a", "b"])).unwrap();
        assert_eq!(texts.len(), 2);
        let ids = inputs(&json!([101, 7592, 102])).unwrap();
        assert_eq!(ids, vec![EmbedInput::Ids(vec![101, 7592, 102])]);
        let lists = inputs(&json!([[1, 2], [3]])).unwrap();
        assert_eq!(lists[1], EmbedInput::Ids(vec![3]));
        for wrong in [
            json!(3),
            json!([-1]),
            json!([1.5]),
            json!({"a": 1}),
            json!(["a", 3]),
        ] {
            assert!(inputs(&wrong).is_err(), "{wrong}");
        }
    }

    #[test]
    fn base64_is_little_endian_float32() {
        assert_eq!(encode(&[1.0]), "AACAPw==");
    }
}
