//! OpenAI-compatible text generation on the named generative models:
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /v1/models` | the named models that generate |
//! | `POST /v1/completions` | `{model, prompt, max_tokens (16), temperature (1), top_p, seed, stop, stream}` |
//! | `POST /v1/chat/completions` | `{model, messages, max_tokens \| max_completion_tokens, ...}` through the model's chat template |
//!
//! With `stream: true` the answer is server-sent events, one chunk per
//! piece of text as it comes, then `data: [DONE]`; a client that goes
//! away ends the generation (its stages free the sequence). Errors are
//! OpenAI's `{"error": {"message", "type", "code"}}` with the status the
//! KServe endpoints use. `n` other than 1, `logprobs` and tools are
//! refused with 400.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tessera_common::wire::generate::{ChatMessage, GenerateParams, GenerateStats, Prompt};
use tokio::sync::mpsc;

use super::HttpError;
use crate::generate::{self, Chunk};
use crate::{repository, CoordinatorError, Shared};

/// What both endpoints take besides the prompt.
#[derive(Deserialize)]
struct Common {
    model: String,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<Value>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    tools: Option<Value>,
}

#[derive(Deserialize)]
struct CompletionRequest {
    #[serde(flatten)]
    common: Common,
    prompt: Value,
}

#[derive(Deserialize)]
struct ChatRequest {
    #[serde(flatten)]
    common: Common,
    messages: Vec<ChatMessageIn>,
}

#[derive(Deserialize)]
struct ChatMessageIn {
    role: String,
    content: Value,
}

/// An OpenAI-style error answer.
pub struct OpenAiError(HttpError);

impl From<HttpError> for OpenAiError {
    fn from(e: HttpError) -> OpenAiError {
        OpenAiError(e)
    }
}

impl From<CoordinatorError> for OpenAiError {
    fn from(e: CoordinatorError) -> OpenAiError {
        OpenAiError(e.into())
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let kind = if self.0.status.is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        };
        let body = json!({ "error": {
            "message": self.0.message,
            "type": kind,
            "code": self.0.status.as_u16(),
        }});
        (self.0.status, Json(body)).into_response()
    }
}

fn bad(message: impl Into<String>) -> OpenAiError {
    OpenAiError(HttpError::bad_request(message))
}

/// `GET /v1/models`.
pub async fn models(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let data: Vec<Value> = shared
        .repository
        .names()
        .into_iter()
        .filter(|name| repository::serving(&shared, name).is_ok_and(|l| l.generator.is_some()))
        .map(|name| json!({ "id": name, "object": "model", "created": 0, "owned_by": "tessera" }))
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

/// `POST /v1/completions`.
pub async fn completions(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<Response, OpenAiError> {
    let request: CompletionRequest = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("malformed completion request: {e}")))?;
    let prompt = match &request.prompt {
        Value::String(s) => s.clone(),
        Value::Array(items) if items.len() == 1 && items[0].is_string() => {
            items[0].as_str().unwrap_or_default().to_string()
        }
        _ => return Err(bad("prompt must be a string (or a list of one)")),
    };
    let params = params(&request.common, 16)?;
    let answer = Answer::Completion;
    serve(shared, request.common, Prompt::Text(prompt), params, answer).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    body: Bytes,
) -> Result<Response, OpenAiError> {
    let request: ChatRequest = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("malformed chat completion request: {e}")))?;
    let messages = request
        .messages
        .iter()
        .map(|m| {
            let content = match &m.content {
                Value::String(s) => Ok(s.clone()),
                Value::Array(parts) => Ok(parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("")),
                _ => Err(bad("a message's content must be text")),
            }?;
            Ok(ChatMessage {
                role: m.role.clone(),
                content,
            })
        })
        .collect::<Result<Vec<_>, OpenAiError>>()?;
    let params = params(&request.common, 256)?;
    serve(
        shared,
        request.common,
        Prompt::Chat(messages),
        params,
        Answer::Chat,
    )
    .await
}

/// The sampling settings, OpenAI's defaults where not given.
fn params(c: &Common, default_max: u32) -> Result<GenerateParams, OpenAiError> {
    if c.n.is_some_and(|n| n != 1) {
        return Err(bad("n must be 1: one choice per request"));
    }
    if c.logprobs
        .as_ref()
        .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
    {
        return Err(bad("logprobs are not supported"));
    }
    if c.tools.is_some() {
        return Err(bad("tools are not supported"));
    }
    let stop = match &c.stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("stop must be strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("stop must be a string or a list of strings")),
    };
    Ok(GenerateParams {
        max_tokens: c
            .max_completion_tokens
            .or(c.max_tokens)
            .unwrap_or(default_max),
        temperature: c.temperature.unwrap_or(1.0),
        top_p: c.top_p.unwrap_or(1.0),
        seed: c.seed.unwrap_or(0),
        stop,
        ..GenerateParams::default()
    })
}

/// Which endpoint answers.
#[derive(Clone, Copy)]
enum Answer {
    Completion,
    Chat,
}

impl Answer {
    fn object(self, streamed: bool) -> &'static str {
        match (self, streamed) {
            (Answer::Completion, _) => "text_completion",
            (Answer::Chat, false) => "chat.completion",
            (Answer::Chat, true) => "chat.completion.chunk",
        }
    }

    /// One choice: text (or a delta of it) and the finish reason.
    fn choice(self, text: &str, finish: Option<&str>, streamed: bool) -> Value {
        match (self, streamed) {
            (Answer::Completion, _) => {
                json!({ "index": 0, "text": text, "finish_reason": finish, "logprobs": null })
            }
            (Answer::Chat, false) => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "finish_reason": finish,
            }),
            (Answer::Chat, true) => {
                let delta = if finish.is_some() {
                    json!({})
                } else {
                    json!({ "role": "assistant", "content": text })
                };
                json!({ "index": 0, "delta": delta, "finish_reason": finish })
            }
        }
    }
}

/// What every answer of one generation shares.
struct Envelope {
    id: String,
    created: u64,
    model: String,
    answer: Answer,
}

impl Envelope {
    fn body(&self, choice: Value, streamed: bool, stats: Option<&GenerateStats>) -> Value {
        let mut body = json!({
            "id": self.id,
            "object": self.answer.object(streamed),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if let Some(s) = stats {
            body["usage"] = json!({
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.generated_tokens,
                "total_tokens": s.prompt_tokens + s.generated_tokens,
            });
        }
        body
    }
}

/// Runs the generation on the named model; answers whole or streamed.
async fn serve(
    shared: Arc<Shared>,
    common: Common,
    prompt: Prompt,
    params: GenerateParams,
    answer: Answer,
) -> Result<Response, OpenAiError> {
    let loaded = repository::serving(&shared, &common.model)?;
    let (tx, mut rx) = mpsc::channel::<Chunk>(64);
    let network = loaded.id;
    let task =
        tokio::spawn(
            async move { generate::generate(&shared, network, &prompt, &params, tx).await },
        );
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let envelope = Envelope {
        id: format!(
            "{}-{network}-{created}",
            if matches!(answer, Answer::Chat) {
                "chatcmpl"
            } else {
                "cmpl"
            }
        ),
        created,
        model: common.model,
        answer,
    };
    let finished =
        |joined: Result<Result<GenerateStats, CoordinatorError>, tokio::task::JoinError>| {
            joined.map_err(|e| CoordinatorError::Worker(format!("the generation stopped: {e}")))?
        };
    if !common.stream {
        let mut text = String::new();
        while let Some(chunk) = rx.recv().await {
            text.push_str(&chunk.text);
        }
        let stats = finished(task.await)?;
        let choice = answer.choice(&text, Some(stats.finish.as_str()), false);
        return Ok(Json(envelope.body(choice, false, Some(&stats))).into_response());
    }
    // The first chunk (or the error that came instead) before answering,
    // so that a refused request gets its status, not an empty stream.
    let first = rx.recv().await;
    let start = match first {
        Some(_) => Streaming::Chunks(rx, task),
        None => Streaming::Finish(finished(task.await)?),
    };
    let events = stream_events(envelope, first, start);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

type Generating = tokio::task::JoinHandle<Result<GenerateStats, CoordinatorError>>;

/// Where a stream of events is.
enum Streaming {
    Chunks(mpsc::Receiver<Chunk>, Generating),
    Finish(GenerateStats),
    Done,
    Over,
}

/// The events of a streamed answer: `first`, then from `start` on.
fn stream_events(
    envelope: Envelope,
    first: Option<Chunk>,
    start: Streaming,
) -> impl futures_util::Stream<Item = Result<Event, Infallible>> {
    let envelope = Arc::new(envelope);
    let data = |body: Value| Event::default().data(body.to_string());
    let head: Vec<Result<Event, Infallible>> = first
        .map(|c| {
            Ok(data(envelope.body(
                envelope.answer.choice(&c.text, None, true),
                true,
                None,
            )))
        })
        .into_iter()
        .collect();
    let rest = futures_util::stream::unfold(start, move |state| {
        let envelope = envelope.clone();
        async move {
            match state {
                Streaming::Chunks(mut rx, task) => match rx.recv().await {
                    Some(c) => {
                        let body =
                            envelope.body(envelope.answer.choice(&c.text, None, true), true, None);
                        Some((Ok(data(body)), Streaming::Chunks(rx, task)))
                    }
                    None => match task.await {
                        Ok(Ok(stats)) => {
                            let choice =
                                envelope
                                    .answer
                                    .choice("", Some(stats.finish.as_str()), true);
                            let body = envelope.body(choice, true, Some(&stats));
                            Some((Ok(data(body)), Streaming::Done))
                        }
                        Ok(Err(e)) => Some((Ok(data(stream_error(&e))), Streaming::Done)),
                        Err(e) => Some((Ok(data(stream_error(&e))), Streaming::Done)),
                    },
                },
                Streaming::Finish(stats) => {
                    let choice = envelope
                        .answer
                        .choice("", Some(stats.finish.as_str()), true);
                    Some((
                        Ok(data(envelope.body(choice, true, Some(&stats)))),
                        Streaming::Done,
                    ))
                }
                Streaming::Done => Some((Ok(Event::default().data("[DONE]")), Streaming::Over)),
                Streaming::Over => None,
            }
        }
    });
    futures_util::stream::iter(head).chain(rest)
}

/// An error after the stream began: one last event says what went wrong.
fn stream_error(e: &dyn std::fmt::Display) -> Value {
    json!({ "error": { "message": e.to_string(), "type": "server_error" } })
}
