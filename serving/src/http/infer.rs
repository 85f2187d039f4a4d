//! `POST /v2/models/{name}[/versions/{v}]/infer`: a KServe v2 inference
//! request, with JSON `data` or the binary tensor extension (the JSON
//! header's length in `Inference-Header-Content-Length`, the tensors'
//! bytes after it in input order), run through the model's routing table
//! straight on its workers ([`crate::core`]).
//! Outputs come back as JSON `data`, or as binary when asked per output
//! (`parameters.binary_data`) or for all (`parameters.binary_data_output`,
//! what the Python client asks by default).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tessera_common::tensor::Tensor;
use tessera_common::wire::routes::Signature;

use super::tensors;
use super::HttpError;
use crate::core::{check_version, VERSION};
use crate::Door;

/// The header that splits a binary request or response.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

#[derive(Deserialize)]
struct InferRequest {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    inputs: Vec<RequestInput>,
    #[serde(default)]
    outputs: Option<Vec<RequestOutput>>,
}

#[derive(Deserialize)]
struct RequestInput {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Deserialize)]
struct RequestOutput {
    name: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
}

pub async fn infer(
    State(door): State<Arc<Door>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    run(&door, &name, None, &headers, body).await
}

pub async fn infer_v(
    State(door): State<Arc<Door>>,
    Path((name, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    run(&door, &name, Some(&version), &headers, body).await
}

async fn run(
    door: &Arc<Door>,
    name: &str,
    version: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    // The body first, whatever the answer: a client still sending when an
    // early answer (unknown model or version) closed the connection would
    // see it reset instead of the answer.
    let limits = BodyLimits {
        bytes: door.limits.max_body_bytes,
        time: door.limits.request_deadline,
    };
    let body = read_body(limits, headers, body).await;
    check_version(name, version)?;
    let table = door.table(name).await?;
    let decoded = async {
        let body = body?;
        let header_len = headers.get(HEADER_LENGTH).cloned();
        let table = table.clone();
        off_async(body.len() > BIG, move || {
            let (json_part, binary) = split_body(header_len.as_ref(), &body)?;
            let request: InferRequest = serde_json::from_slice(&json_part)
                .map_err(|e| HttpError::bad_request(format!("malformed inference request: {e}")))?;
            let inputs = decode_inputs(&table.signature, &request.inputs, &binary)?;
            let deadline = timeout(request.parameters.as_ref())?;
            check_outputs(&request)?;
            Ok((request, inputs, deadline))
        })
        .await
    };
    let (request, inputs, deadline) = match decoded.await {
        Ok(d) => d,
        Err(e) => {
            // Refused before it reached the cluster: counted here.
            let reason = if e.status == StatusCode::PAYLOAD_TOO_LARGE {
                "too_large"
            } else {
                "bad_input"
            };
            door.metrics.failed(name, reason);
            return Err(e);
        }
    };
    let wanted: Vec<String> = request
        .outputs
        .iter()
        .flatten()
        .map(|o| o.name.clone())
        .collect();
    let outputs = door.infer(name, inputs, &wanted, deadline).await?;
    // JSON answers of large outputs are encoded off the async threads.
    let json_bytes: usize = outputs.iter().map(|(_, t)| t.bytes().len()).sum();
    let model = name.to_string();
    off_async(json_bytes > BIG, move || respond(&model, &request, outputs)).await
}

/// Bodies (and outputs) larger than this are decoded (encoded) on a
/// blocking thread.
const BIG: usize = crate::core::OFF_ASYNC_BYTES;

/// Runs `work` here when small, else on tokio's blocking pool.
async fn off_async<T: Send + 'static>(
    big: bool,
    work: impl FnOnce() -> Result<T, HttpError> + Send + 'static,
) -> Result<T, HttpError> {
    if !big {
        return work();
    }
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        HttpError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("request decoding: {e}"),
        )
    })?
}

/// How much of a body is read, and for how long.
struct BodyLimits {
    bytes: u64,
    time: Duration,
}

/// The whole body, refused past `limits.bytes` bytes (413), or when it
/// takes longer than `limits.time` to arrive (408: a client trickling a
/// body holds no connection for ever).
async fn read_body(
    limits: BodyLimits,
    headers: &HeaderMap,
    body: Body,
) -> Result<bytes::Bytes, HttpError> {
    let limit = limits.bytes;
    let too_large = |n: String| {
        HttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body of {n} bytes is over http_max_body_bytes ({limit})"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limit) {
        // A body up to twice the limit is read and dropped, so that the
        // client, still sending, gets the 413 instead of a reset
        // connection; a larger one is refused at once (the connection
        // closes).
        if n <= limit.saturating_mul(2) {
            let mut chunks = body.into_data_stream();
            let drain = async { while let Some(Ok(_)) = chunks.next().await {} };
            let _ = tokio::time::timeout(limits.time, drain).await;
        }
        return Err(too_large(n.to_string()));
    }
    let max = usize::try_from(limit).unwrap_or(usize::MAX);
    match tokio::time::timeout(limits.time, axum::body::to_bytes(body, max)).await {
        Ok(read) => read.map_err(|_| too_large("more than that".into())),
        Err(_) => Err(HttpError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} ms",
                limits.time.as_millis()
            ),
        )),
    }
}

/// The JSON header and the binary tensors after it.
fn split_body(
    header_len: Option<&HeaderValue>,
    body: &bytes::Bytes,
) -> Result<(bytes::Bytes, bytes::Bytes), HttpError> {
    let Some(value) = header_len else {
        return Ok((body.clone(), bytes::Bytes::new()));
    };
    let n = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .ok_or_else(|| {
            HttpError::bad_request(format!(
                "{HEADER_LENGTH} must be a byte count, got {value:?}"
            ))
        })?;
    if n > body.len() {
        return Err(HttpError::bad_request(format!(
            "{HEADER_LENGTH} is {n} but the body has only {} bytes",
            body.len()
        )));
    }
    // Shared slices of the body: the tensors are not copied out of it.
    Ok((body.slice(..n), body.slice(n..)))
}

/// The request's tensors, checked against the model's inputs.
fn decode_inputs(
    signature: &Signature,
    inputs: &[RequestInput],
    binary: &bytes::Bytes,
) -> Result<HashMap<String, Tensor>, HttpError> {
    let bad = HttpError::bad_request;
    let mut tensors = HashMap::new();
    let mut at = 0usize;
    for input in inputs {
        let elem = tensors::input_elem(signature, &input.name, &input.datatype)?;
        let shape = tensors::dims(&input.name, &input.shape)?;
        let tensor = match tensors::binary_size(input.parameters.as_ref())? {
            Some(size) => {
                let end = at.checked_add(size).filter(|&e| e <= binary.len()).ok_or_else(|| {
                    bad(format!(
                        "input '{}': binary_data_size {size} runs past the end of the body ({} binary bytes from offset {at})",
                        input.name,
                        binary.len()
                    ))
                })?;
                let t = tensors::from_binary(&input.name, elem, shape, binary.slice(at..end))?;
                at = end;
                t
            }
            None => {
                let data = input.data.as_ref().ok_or_else(|| {
                    bad(format!(
                        "input '{}' has neither data nor binary_data_size",
                        input.name
                    ))
                })?;
                tensors::from_json(&input.name, elem, shape, data)?
            }
        };
        if tensors.insert(input.name.clone(), tensor).is_some() {
            return Err(bad(format!("input '{}' is given twice", input.name)));
        }
    }
    if at != binary.len() {
        return Err(bad(format!(
            "{} bytes after the JSON header belong to no input",
            binary.len() - at
        )));
    }
    Ok(tensors)
}

/// The request's `timeout` parameter (microseconds, as Triton's clients
/// send it) as a deadline.
fn timeout(parameters: Option<&Map<String, Value>>) -> Result<Option<Duration>, HttpError> {
    match parameters.and_then(|p| p.get("timeout")) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&us| us > 0)
            .map(|us| Some(Duration::from_micros(us)))
            .ok_or_else(|| {
                HttpError::bad_request(format!(
                    "timeout must be a positive number of microseconds, got {v}"
                ))
            }),
    }
}

fn flag(parameters: Option<&Map<String, Value>>, key: &str) -> bool {
    parameters
        .and_then(|p| p.get(key))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Extensions of an asked output that are not served
/// ([`crate::core::check_output`]).
fn check_outputs(request: &InferRequest) -> Result<(), HttpError> {
    for out in request.outputs.iter().flatten() {
        let keys = out
            .parameters
            .iter()
            .flat_map(|p| p.keys().map(String::as_str));
        crate::core::check_output(&out.name, keys)?;
    }
    Ok(())
}

/// The response: the outputs (those asked, in their order, or all), each
/// as JSON or binary.
fn respond(
    model: &str,
    request: &InferRequest,
    outputs: Vec<(String, Tensor)>,
) -> Result<Response, HttpError> {
    let all_binary = flag(request.parameters.as_ref(), "binary_data_output");
    let binary_of = |name: &str| {
        let asked = request.outputs.iter().flatten().find(|o| o.name == name);
        asked
            .and_then(|o| o.parameters.as_ref())
            .and_then(|p| p.get("binary_data"))
            .and_then(Value::as_bool)
            .unwrap_or(all_binary)
    };
    let wanted: Vec<(&(String, Tensor), bool)> =
        outputs.iter().map(|o| (o, binary_of(&o.0))).collect();
    let mut binary_parts: Vec<&Tensor> = Vec::new();
    let mut described = Vec::with_capacity(wanted.len());
    for ((name, t), binary) in wanted {
        let datatype = tensors::datatype(t.elem()).ok_or_else(|| {
            HttpError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("output '{name}' is {}, which has no v2 datatype", t.elem()),
            )
        })?;
        let mut out = json!({ "name": name, "datatype": datatype, "shape": t.shape() });
        if binary {
            out["parameters"] = json!({ "binary_data_size": t.bytes().len() });
            binary_parts.push(t);
        } else {
            out["data"] = tensors::to_json(t)?;
        }
        described.push(out);
    }
    let mut head = json!({ "model_name": model, "model_version": VERSION, "outputs": described });
    if let Some(id) = &request.id {
        head["id"] = id.clone();
    }
    let head = serde_json::to_vec(&head)
        .map_err(|e| HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if binary_parts.is_empty() {
        return Ok(([(header::CONTENT_TYPE, "application/json")], head).into_response());
    }
    let head_len = HeaderValue::from(head.len());
    let tail: usize = binary_parts.iter().map(|t| t.bytes().len()).sum();
    let mut body = Vec::with_capacity(head.len() + tail);
    body.extend_from_slice(&head);
    for t in binary_parts {
        body.extend_from_slice(t.bytes());
    }
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (header::HeaderName::from_static(HEADER_LENGTH), head_len),
        ],
        body,
    )
        .into_response())
}
