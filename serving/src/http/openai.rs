//! OpenAI-compatible text generation on the named generative models:
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /v1/models` | the named models that generate |
//! | `POST /v1/completions` | `{model, prompt, max_tokens (16), temperature (1), top_p, seed, stop, stream}` |
//! | `POST /v1/chat/completions` | `{model, messages, max_tokens \| max_completion_tokens, ...}` through the model's chat template |
//!
//! With `stream: true` the answer is server-sent events, one chunk per
//! piece of text as it comes, the finish reason's, with `stream_options:
//! {"include_usage": true}` one of no choices and the usage (as OpenAI
//! ends it), then `data: [DONE]`; a client that goes
//! away ends the generation (its stages free the sequence). Without a
//! `seed` a request draws with a random one. `logprobs` (completions: the
//! number of most likely tokens; chat: `true` with `top_logprobs`) are
//! answered from the workers' draws. Errors are OpenAI's `{"error":
//! {"message", "type", "code"}}` with the status the KServe endpoints use
//! (429 with `Retry-After` when every copy is full). `stop` ends the text
//! before the first stop string; `n` or `best_of` other than 1, `echo`,
//! `suffix` and tools are refused with 400, never ignored. Every answer
//! reports `usage` (a stream when asked).

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tessera_client::generate::{Event as Generated, Generation};
use tessera_common::wire::data::SampledToken;
use tessera_common::wire::generate::{ChatMessage, GenerateParams, GenerateStats, Prompt};

use super::HttpError;
use crate::{Door, ServeError};

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
    top_logprobs: Option<u32>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    echo: bool,
    #[serde(default)]
    best_of: Option<u32>,
    #[serde(default)]
    suffix: Option<String>,
}

/// `stream_options`: with `include_usage`, a stream ends with a chunk of
/// no choices and the usage.
#[derive(Deserialize, Default, Clone, Copy)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
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
pub(super) struct ChatMessageIn {
    role: String,
    content: Value,
}

/// An OpenAI-style error answer.
#[derive(Debug)]
pub struct OpenAiError(HttpError);

impl From<HttpError> for OpenAiError {
    fn from(e: HttpError) -> OpenAiError {
        OpenAiError(e)
    }
}

impl From<ServeError> for OpenAiError {
    fn from(e: ServeError) -> OpenAiError {
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
        let mut response = (self.0.status, Json(body)).into_response();
        super::retry_after(&mut response);
        response
    }
}

pub(super) fn bad(message: impl Into<String>) -> OpenAiError {
    OpenAiError(HttpError::bad_request(message))
}

/// `GET /v1/models`: each with its context (`max_model_len`, as vLLM
/// names it) and what it does (`task`: `generate`).
pub async fn models(State(door): State<Arc<Door>>) -> Json<Value> {
    let data: Vec<Value> = door
        .openai_models()
        .await
        .into_iter()
        .map(|m| {
            json!({
                "id": m.name, "object": "model", "created": 0, "owned_by": "tessera",
                "max_model_len": m.max_model_len, "task": m.task.as_str(),
            })
        })
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

/// `POST /v1/completions`.
pub async fn completions(
    State(door): State<Arc<Door>>,
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
    let params = params(&request.common, 16, Answer::Completion)?;
    let answer = Answer::Completion;
    serve(door, request.common, Prompt::Text(prompt), params, answer).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(door): State<Arc<Door>>,
    body: Bytes,
) -> Result<Response, OpenAiError> {
    let request: ChatRequest = serde_json::from_slice(&body)
        .map_err(|e| bad(format!("malformed chat completion request: {e}")))?;
    let messages = chat_messages(&request.messages)?;
    let params = params(&request.common, 256, Answer::Chat)?;
    serve(
        door,
        request.common,
        Prompt::Chat(messages),
        params,
        Answer::Chat,
    )
    .await
}

/// Chat messages as the template takes them (a content of parts: their
/// text joined).
pub(super) fn chat_messages(messages: &[ChatMessageIn]) -> Result<Vec<ChatMessage>, OpenAiError> {
    messages
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
        .collect()
}

/// The most likely tokens a request may ask the log-probabilities of.
const MAX_LOGPROBS: u32 = 20;

/// How many most likely tokens' log-probabilities a request asks for, and
/// whether it asks for the drawn token's (`None`: not at all).
fn logprobs(c: &Common, answer: Answer) -> Result<Option<u32>, OpenAiError> {
    let asked = match (answer, &c.logprobs) {
        (_, None | Some(Value::Null) | Some(Value::Bool(false))) => None,
        (Answer::Completion, Some(Value::Number(n))) => n.as_u64().map(|n| n as u32),
        (Answer::Chat, Some(Value::Bool(true))) => Some(c.top_logprobs.unwrap_or(0)),
        (Answer::Completion, _) => return Err(bad("logprobs must be a number of tokens")),
        (Answer::Chat, _) => return Err(bad("logprobs must be true or false")),
    };
    match asked {
        Some(n) if n > MAX_LOGPROBS => Err(bad(format!("at most {MAX_LOGPROBS} logprobs"))),
        other => Ok(other),
    }
}

/// The sampling settings, OpenAI's defaults where not given.
fn params(c: &Common, default_max: u32, answer: Answer) -> Result<GenerateParams, OpenAiError> {
    if c.n.is_some_and(|n| n != 1) {
        return Err(bad("n must be 1: one choice per request"));
    }
    let logprobs = logprobs(c, answer)?;
    if c.tools.is_some() {
        return Err(bad("tools are not supported"));
    }
    if c.echo {
        return Err(bad(
            "echo is not supported: the answer holds the new text only",
        ));
    }
    if c.best_of.is_some_and(|n| n != 1) {
        return Err(bad("best_of must be 1: one choice per request"));
    }
    if c.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(bad("suffix is not supported"));
    }
    if c.stream_options.is_some() && !c.stream {
        return Err(bad("stream_options is only for stream: true"));
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
        seed: c.seed,
        // The drawn token's log-probability comes with the top ones: one
        // at least when any is asked.
        logprobs: logprobs.map_or(0, |n| n.max(1)),
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

    /// One choice: text (or a delta of it), its log-probabilities when
    /// asked, and the finish reason.
    fn choice(self, text: &str, logprobs: Value, finish: Option<&str>, streamed: bool) -> Value {
        match (self, streamed) {
            (Answer::Completion, _) => {
                json!({ "index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs })
            }
            (Answer::Chat, false) => json!({
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
            (Answer::Chat, true) => {
                let delta = if finish.is_some() {
                    json!({})
                } else {
                    json!({ "role": "assistant", "content": text })
                };
                json!({ "index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish })
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
    /// The most likely tokens' log-probabilities asked for (`None`: none).
    logprobs: Option<u32>,
    /// Counts the tokens in its live figures.
    door: Arc<Door>,
    /// A stream ends with a chunk of the usage (`stream_options`).
    include_usage: bool,
}

/// Completion ids: unique in the process and across processes (a random
/// base, then a counter through a bijective mix).
fn completion_id(answer: Answer) -> String {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    let mut z = base.wrapping_add(
        NEXT.fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    let prefix = match answer {
        Answer::Chat => "chatcmpl",
        Answer::Completion => "cmpl",
    };
    format!("{prefix}-{:016x}", z ^ (z >> 31))
}

impl Envelope {
    /// An answer (or a chunk) of `choices`, with the usage when given.
    fn body(&self, choices: &[Value], streamed: bool, stats: Option<&GenerateStats>) -> Value {
        let mut body = json!({
            "id": self.id,
            "object": self.answer.object(streamed),
            "created": self.created,
            "model": self.model,
            "choices": choices,
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

    /// The log-probabilities of `drawn` in this endpoint's shape (`null`
    /// when none were asked).
    fn logprobs(&self, generation: &Generation, drawn: &[SampledToken]) -> Value {
        let Some(n) = self.logprobs else {
            return Value::Null;
        };
        let top = |t: &SampledToken| -> Vec<(String, f32)> {
            t.top
                .iter()
                .take(n as usize)
                .map(|&(id, lp)| (generation.token(id), lp))
                .collect()
        };
        match self.answer {
            Answer::Completion => json!({
                "tokens": drawn.iter().map(|t| generation.token(t.id)).collect::<Vec<_>>(),
                "token_logprobs": drawn.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                "top_logprobs": drawn.iter().map(|t| {
                    top(t).into_iter().map(|(k, v)| (k, json!(v))).collect::<serde_json::Map<_, _>>()
                }).collect::<Vec<_>>(),
            }),
            Answer::Chat => json!({ "content": drawn.iter().map(|t| {
                let token = generation.token(t.id);
                json!({
                    "token": token,
                    "logprob": t.logprob,
                    "bytes": token.as_bytes(),
                    "top_logprobs": top(t).into_iter().map(|(tok, lp)| json!({
                        "token": tok, "logprob": lp, "bytes": tok.as_bytes(),
                    })).collect::<Vec<_>>(),
                })
            }).collect::<Vec<_>>() }),
        }
    }
}

/// Runs the generation on the named model; answers whole or streamed. A
/// request refused before it generates (unknown model, bad settings, a
/// prompt beyond the context, every copy full) gets its status.
async fn serve(
    door: Arc<Door>,
    common: Common,
    prompt: Prompt,
    params: GenerateParams,
    answer: Answer,
) -> Result<Response, OpenAiError> {
    let asked = logprobs(&common, answer)?;
    let mut generation = match door.generate(&common.model, prompt, params).await {
        Ok(g) => g,
        Err(e) => {
            door.live_failed(&common.model);
            return Err(e.into());
        }
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let envelope = Envelope {
        id: completion_id(answer),
        created,
        model: common.model,
        answer,
        logprobs: asked,
        door: door.clone(),
        include_usage: common.stream_options.is_some_and(|o| o.include_usage),
    };
    if !common.stream {
        let (mut text, mut drawn) = (String::new(), Vec::new());
        let stats = loop {
            match generation.next().await.map_err(ServeError::from)? {
                Some(Generated::Tokens {
                    text: t,
                    logprobs,
                    ids,
                }) => {
                    door.live_tokens(&envelope.model, ids.len());
                    text.push_str(&t);
                    drawn.extend(logprobs);
                }
                Some(Generated::Done(stats)) => {
                    let total = std::time::Duration::from_micros(stats.total_us);
                    door.live_served(&envelope.model, total);
                    break stats;
                }
                None => return Err(bad("the generation ended without figures")),
            }
        };
        let logprobs = envelope.logprobs(&generation, &drawn);
        let choice = answer.choice(&text, logprobs, Some(stats.finish.as_str()), false);
        return Ok(Json(envelope.body(&[choice], false, Some(&stats))).into_response());
    }
    // The first event (or the error that came instead) before answering,
    // so that a refused request gets its status, not an empty stream.
    let first = generation.next().await.map_err(ServeError::from)?;
    let events = stream_events(envelope, generation, first);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Where a stream of events is.
enum Streaming {
    Going(Generation),
    /// The usage chunk, then `[DONE]`.
    Usage(Value),
    Done,
    Over,
}

/// The events of a streamed answer: `first`, then the generation's.
fn stream_events(
    envelope: Envelope,
    generation: Generation,
    first: Option<Generated>,
) -> impl futures_util::Stream<Item = Result<Event, Infallible>> {
    let envelope = Arc::new(envelope);
    let (head, state) = match first {
        Some(e) => {
            let (data, next) = event(&envelope, generation, Ok(Some(e)));
            (Some(Ok(data)), next)
        }
        None => (None, Streaming::Done),
    };
    let rest = futures_util::stream::unfold(state, move |state| {
        let envelope = envelope.clone();
        async move {
            match state {
                Streaming::Going(mut generation) => {
                    let next = generation.next().await;
                    let (data, state) = event(&envelope, generation, next);
                    Some((Ok(data), state))
                }
                Streaming::Usage(body) => {
                    let data = Event::default().data(body.to_string());
                    Some((Ok(data), Streaming::Done))
                }
                Streaming::Done => Some((Ok(Event::default().data("[DONE]")), Streaming::Over)),
                Streaming::Over => None,
            }
        }
    });
    futures_util::stream::iter(head).chain(rest)
}

/// One event of a stream, and what comes after it.
fn event(
    envelope: &Envelope,
    generation: Generation,
    next: Result<Option<Generated>, tessera_client::ClientError>,
) -> (Event, Streaming) {
    let data = |body: Value| Event::default().data(body.to_string());
    match next {
        Ok(Some(Generated::Tokens {
            text,
            logprobs,
            ids,
        })) => {
            envelope.door.live_tokens(&envelope.model, ids.len());
            let lp = envelope.logprobs(&generation, &logprobs);
            let choice = envelope.answer.choice(&text, lp, None, true);
            let body = envelope.body(&[choice], true, None);
            (data(body), Streaming::Going(generation))
        }
        Ok(Some(Generated::Done(stats))) => {
            let total = std::time::Duration::from_micros(stats.total_us);
            envelope.door.live_served(&envelope.model, total);
            let choice = envelope
                .answer
                .choice("", Value::Null, Some(stats.finish.as_str()), true);
            let last = data(envelope.body(&[choice], true, None));
            match envelope.include_usage {
                true => (
                    last,
                    Streaming::Usage(envelope.body(&[], true, Some(&stats))),
                ),
                false => (last, Streaming::Done),
            }
        }
        Ok(None) => (data(stream_error(&"the generation ended")), Streaming::Done),
        Err(e) => (data(stream_error(&e)), Streaming::Done),
    }
}

/// An error after the stream began: one last event says what went wrong.
fn stream_error(e: &dyn std::fmt::Display) -> Value {
    json!({ "error": { "message": e.to_string(), "type": "server_error" } })
}
