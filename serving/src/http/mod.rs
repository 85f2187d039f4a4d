//! A front door's HTTP listener (axum on the process's tokio runtime): the
//! KServe v2 / Open Inference Protocol REST API that Triton's, KServe's
//! and MLServer's clients speak, with the binary tensor and model
//! repository extensions, and Prometheus `/metrics`; a thin codec over
//! [`crate::core`].
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /v2/health/live` | 200 while the process serves |
//! | `GET /v2/health/ready` | 200 with ≥1 worker and every wanted model deployed, else 503 |
//! | `GET /v2` | server metadata and extensions |
//! | `GET /v2/models/{name}[/versions/{v}]` | inputs, outputs (datatype, shape, -1 dynamic) |
//! | `GET /v2/models/{name}[/versions/{v}]/ready` | 200 when deployed, else 503 |
//! | `POST /v2/models/{name}[/versions/{v}]/infer` | inference (JSON or binary tensors) |
//! | `POST /v2/repository/index` | every named model and its state |
//! | `POST /v2/repository/models/{name}/load` / `unload` | the repository extension (only with `[serving] model_control`; loads confined to `model_repository`: [`crate::control`]) |
//! | `GET /metrics` | Prometheus text format |
//! | `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` | OpenAI-compatible generation ([`openai`]) |
//! | `POST /v1/embeddings` | sentence embeddings of the models declared as such ([`embeddings`]) |
//! | `GET /health`, `POST /tokenize`, `POST /detokenize` | health and tokenization as vLLM and llama-server answer them ([`tokenize`]) |
//! | `GET /`, `GET /api/...` | the cluster page and its JSON API ([`page`]) |
//!
//! Errors are `{"error": "..."}` with 400 (bad request), 401 (no token the
//! server accepts, with `[serving] tokens_file`), 403 (model control off),
//! 404 (unknown model or version), 408 (a body too slow to arrive), 413
//! (body over `http_max_body_bytes`), 429 with `Retry-After` (every copy
//! busy), 503 (not ready) or 500 (a worker failed). Every model has the
//! one version `1`. Connections (TLS, limits) are served by
//! [`crate::listener`].
//!
//! Layout: this file (routes, health, metadata, repository, metrics);
//! `infer` (the infer endpoint); `tensors` (datatypes, JSON and binary
//! tensor codecs); `openai` (OpenAI-compatible generation); `embeddings`;
//! `tokenize`
//! (`/health`, `/tokenize`, `/detokenize`); `page` (the cluster page and
//! its API).

pub mod embeddings;
mod infer;
pub mod openai;
pub mod page;
pub mod tensors;
pub mod tokenize;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tessera_common::wire::routes::TensorSig;

use crate::core::{check_version, PLATFORM, VERSION};
use crate::error::http_status;
use crate::{control, Door, ServeError};

/// Serves HTTP (or HTTPS) on `listener` until the front door shuts down.
pub async fn serve(door: Arc<Door>, listener: tokio::net::TcpListener) {
    if let Ok(addr) = listener.local_addr() {
        let scheme = door.rules.scheme();
        tracing::info!(%addr, "serving KServe v2 over {scheme} and /metrics");
    }
    let router = router(door.clone());
    crate::listener::serve(door, listener, router, "HTTP").await;
}

/// Every route.
pub fn router(door: Arc<Door>) -> Router {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2/models/{name}", get(model_metadata))
        .route(
            "/v2/models/{name}/versions/{version}",
            get(model_metadata_v),
        )
        .route("/v2/models/{name}/ready", get(model_ready))
        .route(
            "/v2/models/{name}/versions/{version}/ready",
            get(model_ready_v),
        )
        .route("/v2/models/{name}/infer", post(infer::infer))
        .route(
            "/v2/models/{name}/versions/{version}/infer",
            post(infer::infer_v),
        )
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/repository/models/{name}/load", post(load))
        .route("/v2/repository/models/{name}/unload", post(unload))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(openai::models))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/health", get(tokenize::health))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .merge(page::routes())
        .fallback(|| async { HttpError::new(StatusCode::NOT_FOUND, "no such endpoint") })
        .layer(axum::middleware::from_fn_with_state(
            door.clone(),
            crate::auth::require_token,
        ))
        .with_state(door)
}

/// An error answer: `{"error": "..."}` with its status.
#[derive(Debug)]
pub struct HttpError {
    pub status: StatusCode,
    pub message: String,
}

impl HttpError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> HttpError {
        HttpError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<tensors::CodecError> for HttpError {
    /// A request's tensor that is wrong: 400.
    fn from(e: tensors::CodecError) -> HttpError {
        HttpError::bad_request(e.to_string())
    }
}

impl From<ServeError> for HttpError {
    fn from(e: ServeError) -> HttpError {
        let status = match e {
            ServeError::ControlOff => StatusCode::FORBIDDEN,
            ref other => StatusCode::from_u16(http_status(other.kind()))
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        };
        HttpError::new(status, e.to_string())
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({ "error": self.message }))).into_response();
        retry_after(&mut response);
        response
    }
}

/// A busy answer (429) says when to try again.
pub fn retry_after(response: &mut Response) {
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
}

async fn live() -> StatusCode {
    StatusCode::OK
}

/// Open to probes without a token; with tokens on, a 503 says no more than
/// "not ready" (the reason names models).
async fn ready(State(door): State<Arc<Door>>) -> Result<StatusCode, HttpError> {
    door.ready().await.map(|()| StatusCode::OK).map_err(|why| {
        let why = match door.rules.tokens {
            Some(_) => "not ready".to_string(),
            None => why.to_string(),
        };
        HttpError::new(StatusCode::SERVICE_UNAVAILABLE, why)
    })
}

async fn server_metadata() -> Json<Value> {
    Json(json!({
        "name": "tessera",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data", "model_repository"],
    }))
}

async fn model_metadata(
    State(door): State<Arc<Door>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, HttpError> {
    let table = door.table(&name).await?;
    Ok(Json(json!({
        "name": name,
        "versions": [VERSION],
        "platform": PLATFORM,
        "inputs": tensor_metadata(&table.signature.inputs),
        "outputs": tensor_metadata(&table.signature.outputs),
    })))
}

async fn model_metadata_v(
    State(door): State<Arc<Door>>,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<Value>, HttpError> {
    check_version(&name, Some(&version))?;
    model_metadata(State(door), Path(name)).await
}

/// `[{name, datatype, shape}]`, -1 for a dynamic dim.
fn tensor_metadata(tensors: &[TensorSig]) -> Vec<Value> {
    tensors::metadata(tensors)
        .into_iter()
        .map(
            |(name, datatype, shape)| json!({ "name": name, "datatype": datatype, "shape": shape }),
        )
        .collect()
}

async fn model_ready(
    State(door): State<Arc<Door>>,
    Path(name): Path<String>,
) -> Result<StatusCode, HttpError> {
    door.model_ready(&name).await?;
    Ok(StatusCode::OK)
}

async fn model_ready_v(
    State(door): State<Arc<Door>>,
    Path((name, version)): Path<(String, String)>,
) -> Result<StatusCode, HttpError> {
    check_version(&name, Some(&version))?;
    model_ready(State(door), Path(name)).await
}

async fn repository_index(State(door): State<Arc<Door>>) -> Result<Json<Value>, HttpError> {
    let models: Vec<Value> = door
        .index()
        .await?
        .into_iter()
        .map(|s| {
            json!({
                "name": s.name,
                "version": VERSION,
                "state": s.state.as_str(),
                "reason": s.reason,
            })
        })
        .collect();
    Ok(Json(Value::Array(models)))
}

/// `POST /v2/repository/models/{name}/load`: the model of that name
/// (configured, loaded before, or in `[serving] model_repository`), placed
/// as `{"parameters": {"config": "<json>"}}` says if given (the keys of a
/// `[models.NAME]` table). Refused unless `[serving] model_control`.
async fn load(
    State(door): State<Arc<Door>>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, HttpError> {
    if !door.rules.model_control {
        return Err(ServeError::ControlOff.into());
    }
    let config = load_config(&body)?;
    control::load(&door, &name, config.as_deref()).await?;
    Ok(Json(json!({})))
}

/// The `config` parameter of a load request, if any
/// ([`crate::core::load_config`]).
fn load_config(body: &[u8]) -> Result<Option<String>, HttpError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let request: Value = serde_json::from_slice(body)
        .map_err(|e| HttpError::bad_request(format!("malformed JSON: {e}")))?;
    let Some(params) = request.get("parameters").and_then(Value::as_object) else {
        return Ok(None);
    };
    let params = params.iter().map(|(k, v)| {
        let value = match v {
            Value::String(text) => crate::core::LoadParam::Text(text),
            _ => crate::core::LoadParam::Other,
        };
        (k.as_str(), value)
    });
    Ok(crate::core::load_config(params)?)
}

async fn unload(
    State(door): State<Arc<Door>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, HttpError> {
    control::unload(&door, &name).await?;
    Ok(Json(json!({})))
}

async fn metrics(State(door): State<Arc<Door>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        door.render_metrics(),
    )
}
