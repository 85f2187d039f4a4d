//! The coordinator's HTTP listener (axum on the coordinator's tokio
//! runtime): the KServe v2 / Open Inference Protocol REST API that
//! Triton's, KServe's and MLServer's clients speak, with the binary tensor
//! and model repository extensions, and Prometheus `/metrics`.
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
//! | `POST /v2/repository/models/{name}/load` / `unload` | the repository extension |
//! | `GET /metrics` | Prometheus text format |
//! | `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` | OpenAI-compatible generation ([`openai`]) |
//!
//! Errors are `{"error": "..."}` with 400 (bad request), 404 (unknown
//! model or version), 413 (body over `http_max_body_bytes`), 503 (not
//! ready) or 500 (a worker failed). Every model has the one version `1`.
//!
//! Layout: this file (routes, health, metadata, repository, metrics);
//! `infer` (the infer endpoint); `tensors` (datatypes, JSON and binary
//! tensor codecs); `openai` (OpenAI-compatible generation).

mod infer;
pub mod openai;
pub mod tensors;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tessera_common::graph::{Dim, Graph};
use tessera_common::wire::control::{ErrorKind, ModelState};

use crate::config::ModelConfig;
use crate::{repository, CoordinatorError, Shared};

/// The platform models report (an ONNX model, as Triton names it).
pub const PLATFORM: &str = "onnx_onnxv1";
/// The one version of every model.
pub const VERSION: &str = "1";

/// Binds the HTTP listener (now, so that a taken port fails at start).
pub fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, CoordinatorError> {
    let fail = |e: std::io::Error| CoordinatorError::Http(format!("cannot listen on {addr}: {e}"));
    let std = std::net::TcpListener::bind(addr).map_err(fail)?;
    std.set_nonblocking(true).map_err(fail)?;
    tokio::net::TcpListener::from_std(std).map_err(fail)
}

/// Serves HTTP on `listener` until the coordinator shuts down.
pub async fn serve(shared: Arc<Shared>, listener: tokio::net::TcpListener) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving KServe v2 over HTTP and /metrics");
    }
    let closing = shared.clone();
    let stop = async move {
        while !closing.shutting_down() {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    };
    if let Err(e) = axum::serve(listener, router(shared))
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::error!("the HTTP listener stopped: {e}");
    }
}

/// Every route.
pub fn router(shared: Arc<Shared>) -> Router {
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
        .fallback(|| async { HttpError::new(StatusCode::NOT_FOUND, "no such endpoint") })
        .with_state(shared)
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

impl From<CoordinatorError> for HttpError {
    fn from(e: CoordinatorError) -> HttpError {
        let status = match e.kind() {
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::BadInput | ErrorKind::Refused => StatusCode::BAD_REQUEST,
            ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::WorkerLost => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ErrorKind::Worker | ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        HttpError::new(status, e.to_string())
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

/// Only version `1` exists.
fn check_version(name: &str, version: &str) -> Result<(), HttpError> {
    if version == VERSION || version.is_empty() {
        Ok(())
    } else {
        Err(HttpError::new(
            StatusCode::NOT_FOUND,
            format!("model {name} has no version '{version}' (its one version is {VERSION})"),
        ))
    }
}

async fn live() -> StatusCode {
    StatusCode::OK
}

async fn ready(State(shared): State<Arc<Shared>>) -> Result<StatusCode, HttpError> {
    if shared.workers.is_empty() {
        return Err(HttpError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no worker is registered",
        ));
    }
    let waiting: Vec<String> = repository::statuses(&shared)
        .into_iter()
        .filter(|s| !matches!(s.state, ModelState::Ready | ModelState::Unloaded))
        .map(|s| format!("{} ({})", s.name, s.state.as_str().to_lowercase()))
        .collect();
    if waiting.is_empty() {
        Ok(StatusCode::OK)
    } else {
        Err(HttpError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("models not deployed yet: {}", waiting.join(", ")),
        ))
    }
}

async fn server_metadata() -> Json<Value> {
    Json(json!({
        "name": "tessera",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data", "model_repository"],
    }))
}

async fn model_metadata(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, HttpError> {
    let graph = repository::graph(&shared, &name).await?;
    Ok(Json(json!({
        "name": name,
        "versions": [VERSION],
        "platform": PLATFORM,
        "inputs": tensor_metadata(&graph, &graph.inputs),
        "outputs": tensor_metadata(&graph, &graph.outputs),
    })))
}

async fn model_metadata_v(
    State(shared): State<Arc<Shared>>,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<Value>, HttpError> {
    check_version(&name, &version)?;
    model_metadata(State(shared), Path(name)).await
}

/// `[{name, datatype, shape}]`, -1 for a dynamic dim.
fn tensor_metadata(graph: &Graph, tensors: &[tessera_common::graph::TensorId]) -> Vec<Value> {
    tensors
        .iter()
        .map(|&t| {
            let t = graph.tensor(t);
            let shape: Vec<i64> = match &t.shape {
                Some(dims) => dims
                    .iter()
                    .map(|d| match d {
                        Dim::Known(n) => *n,
                        _ => -1,
                    })
                    .collect(),
                None => vec![-1],
            };
            json!({
                "name": t.name,
                "datatype": t.elem_type.and_then(tensors::datatype).unwrap_or("UNKNOWN"),
                "shape": shape,
            })
        })
        .collect()
}

async fn model_ready(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<StatusCode, HttpError> {
    let entry = shared
        .repository
        .get(&name)
        .ok_or_else(|| CoordinatorError::UnknownModel(name.clone()))?;
    let status = repository::status(&shared, &entry);
    if status.state == ModelState::Ready {
        Ok(StatusCode::OK)
    } else {
        let mut why = format!("model {name} is {}", status.state.as_str().to_lowercase());
        if !status.reason.is_empty() {
            why = format!("{why}: {}", status.reason);
        }
        Err(HttpError::new(StatusCode::SERVICE_UNAVAILABLE, why))
    }
}

async fn model_ready_v(
    State(shared): State<Arc<Shared>>,
    Path((name, version)): Path<(String, String)>,
) -> Result<StatusCode, HttpError> {
    check_version(&name, &version)?;
    model_ready(State(shared), Path(name)).await
}

async fn repository_index(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let models: Vec<Value> = repository::statuses(&shared)
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
    Json(Value::Array(models))
}

/// `POST /v2/repository/models/{name}/load`: the repository's model of
/// that name, or (with `{"parameters": {"config": "<json>"}}`, the keys of
/// a `[models.NAME]` table) a model defined or redefined by the request.
async fn load(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, HttpError> {
    let new = match load_config(&body)? {
        Some(config) => {
            config
                .check(&name)
                .map_err(|e| HttpError::bad_request(format!("model {name}{e}")))?;
            Some(repository::definition(&name, &config))
        }
        None => None,
    };
    repository::load(&shared, &name, new, repository::progress_log(&name)).await?;
    Ok(Json(json!({})))
}

/// The `config` parameter of a load request, if any.
fn load_config(body: &[u8]) -> Result<Option<ModelConfig>, HttpError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let request: Value = serde_json::from_slice(body)
        .map_err(|e| HttpError::bad_request(format!("malformed JSON: {e}")))?;
    let Some(params) = request.get("parameters").and_then(Value::as_object) else {
        return Ok(None);
    };
    if let Some(file) = params.keys().find(|k| k.starts_with("file:")) {
        return Err(HttpError::bad_request(format!(
            "'{file}': model files in the request are not supported; give parameters.config with a path on the coordinator"
        )));
    }
    let Some(config) = params.get("config") else {
        return Ok(None);
    };
    let text = config
        .as_str()
        .ok_or_else(|| HttpError::bad_request("parameters.config must be a JSON string"))?;
    let config: ModelConfig = serde_json::from_str(text).map_err(|e| {
        HttpError::bad_request(format!(
            "parameters.config: {e} (keys: {})",
            crate::config::MODEL_KEYS.join(", ")
        ))
    })?;
    Ok(Some(config))
}

async fn unload(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
) -> Result<Json<Value>, HttpError> {
    repository::unload(&shared, &name).await?;
    Ok(Json(json!({})))
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        shared.metrics.render(),
    )
}
