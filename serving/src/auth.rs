//! The bearer-token check in front of both listeners (one middleware for
//! the HTTP routes and the gRPC service): with `[serving] tokens_file`,
//! every request but the health probes (`GET /health`, `/v2/health/live`
//! and `/v2/health/ready`, gRPC `ServerLive` and `ServerReady`: Kubernetes'
//! kubelet and load balancers probe without a token, and the answer tells
//! nothing but up or down) and the cluster page's files (`/` and its
//! assets: they hold no data; the page asks for a token) wants `Authorization: Bearer TOKEN`. HTTP callers get 401 with
//! `WWW-Authenticate: Bearer`; gRPC callers get UNAUTHENTICATED. Neither the
//! header nor the token is logged.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::tokens::bearer;
use crate::Door;

/// Paths open to anyone: the server's health probes.
const OPEN: [&str; 5] = [
    "/health",
    "/v2/health/live",
    "/v2/health/ready",
    "/inference.GRPCInferenceService/ServerLive",
    "/inference.GRPCInferenceService/ServerReady",
];

/// The middleware: passes the request on, or refuses it.
pub async fn require_token(
    State(door): State<Arc<Door>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(tokens) = &door.rules.tokens else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    if OPEN.contains(&path) || crate::http::page::OPEN.contains(&path) {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()));
    let why = match presented {
        Some(token) if tokens.allows(token) => return next.run(request).await,
        Some(_) => "the bearer token is not one this server accepts",
        None => "this server wants an Authorization: Bearer TOKEN header",
    };
    door.metrics.unauthorized();
    if is_grpc(&request) {
        return tonic::Status::unauthenticated(why)
            .into_http::<axum::body::Body>()
            .into_response();
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(serde_json::json!({ "error": why })),
    )
        .into_response()
}

fn is_grpc(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}
