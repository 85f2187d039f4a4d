//! Tokenization of the generative models, in the shapes vLLM and
//! llama-server answer (clients budget prompts with them), and the health
//! check OpenAI-compatible load clients make first:
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /health` | 200 `{"status": "ok", "models": n}` when this front door can serve a model, else 503 with why |
//! | `POST /tokenize` | `{model, prompt \| messages, add_special_tokens}` → `{tokens, count, max_model_len}` |
//! | `POST /detokenize` | `{model, tokens}` → `{prompt}` |
//!
//! The ids are those the model is fed: a prompt gets the special tokens
//! a completion gets (a BOS where the vocabulary adds one) unless
//! `add_special_tokens` says otherwise; messages go through the chat
//! template with the assistant's turn opened, as a chat completion's.
//! `model` may be left out when one generative model serves. llama-server's
//! names are taken too: `content` for the prompt, `add_special`; its
//! detokenize answer's `content` comes beside `prompt`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tessera_common::wire::generate::Prompt;

use super::openai::{bad, chat_messages, ChatMessageIn, OpenAiError};
use crate::core::Task;
use crate::Door;

#[derive(Deserialize)]
struct TokenizeRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default, alias = "content")]
    prompt: Option<String>,
    #[serde(default)]
    messages: Option<Vec<ChatMessageIn>>,
    #[serde(default, alias = "add_special")]
    add_special_tokens: Option<bool>,
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    #[serde(default)]
    model: Option<String>,
    tokens: Vec<u32>,
}

/// `GET /health`: open to probes like `/v2/health/ready`; with tokens on,
/// a 503 says no more than "not ready".
pub async fn health(State(door): State<Arc<Door>>) -> Response {
    match door.health().await {
        Ok(models) => Json(json!({ "status": "ok", "models": models })).into_response(),
        Err(why) => {
            let why = match door.rules.tokens {
                Some(_) => "not ready".to_string(),
                None => why,
            };
            let body = json!({ "status": "unavailable", "error": why });
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

/// The model a request names, else the one generative model serving.
async fn model(door: &Door, named: Option<String>) -> Result<String, OpenAiError> {
    if let Some(name) = named.filter(|n| !n.is_empty()) {
        return Ok(name);
    }
    let generative: Vec<String> = door
        .openai_models()
        .await
        .into_iter()
        .filter(|m| m.task == Task::Generate)
        .map(|m| m.name)
        .collect();
    match generative.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(bad("model is required (no generative model serves)")),
        _ => Err(bad(format!(
            "model is required: one of {}",
            generative.join(", ")
        ))),
    }
}

/// `POST /tokenize`.
pub async fn tokenize(
    State(door): State<Arc<Door>>,
    body: Bytes,
) -> Result<Json<Value>, OpenAiError> {
    let request: TokenizeRequest = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("malformed tokenize request: {e}")))?;
    let prompt = match (request.prompt, &request.messages) {
        (Some(text), None) => Prompt::Text(text),
        (None, Some(messages)) => Prompt::Chat(chat_messages(messages)?),
        _ => return Err(bad("give either prompt or messages")),
    };
    let name = model(&door, request.model).await?;
    let (tokens, max_model_len) = door
        .tokenize(&name, &prompt, request.add_special_tokens)
        .await?;
    Ok(Json(json!({
        "tokens": tokens,
        "count": tokens.len(),
        "max_model_len": max_model_len,
    })))
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(door): State<Arc<Door>>,
    body: Bytes,
) -> Result<Json<Value>, OpenAiError> {
    let request: DetokenizeRequest = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("malformed detokenize request: {e}")))?;
    let name = model(&door, request.model).await?;
    let text = door.detokenize(&name, &request.tokens).await?;
    Ok(Json(json!({ "prompt": text, "content": text })))
}
