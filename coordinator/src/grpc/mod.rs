//! The coordinator's gRPC listener: the KServe v2 / Open Inference
//! Protocol's `inference.GRPCInferenceService` (what Triton's and KServe's
//! gRPC clients call), served by tonic on the coordinator's runtime, on
//! the same connection loop, token check and limits as HTTP
//! ([`crate::serving`]).
//!
//! | method | answer |
//! |---|---|
//! | `ServerLive`, `ServerReady`, `ModelReady` | as HTTP's health endpoints (`ready: false` instead of 503) |
//! | `ServerMetadata`, `ModelMetadata` | as HTTP's (-1 for a dynamic dim) |
//! | `ModelInfer` | inference: `raw_input_contents` or typed `contents` in, `raw_output_contents` out ([`infer`]) |
//! | `RepositoryIndex`, `RepositoryModelLoad`, `RepositoryModelUnload` | the repository extension, under `[serving]`'s rules |
//!
//! Errors are the HTTP errors' kinds as gRPC codes: INVALID_ARGUMENT (400),
//! NOT_FOUND (404), PERMISSION_DENIED (403: model control off),
//! UNAUTHENTICATED (401), UNAVAILABLE (503), DEADLINE_EXCEEDED,
//! OUT_OF_RANGE (a message over `http_max_body_bytes`: tonic's code), INTERNAL;
//! methods Tessera does not serve answer UNIMPLEMENTED.

mod infer;

use std::sync::Arc;

use tessera_common::wire::control::{ErrorKind, ModelState};
use tonic::{Request, Response, Status};

use crate::http::{tensors, PLATFORM, VERSION};
use crate::serving::{control, ServingError};
use crate::{repository, CoordinatorError, Shared};

/// The generated protocol types, client and server.
pub mod proto {
    tonic::include_proto!("inference");
}

use proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};

/// Serves gRPC on `listener` until the coordinator shuts down.
pub async fn serve(shared: Arc<Shared>, listener: tokio::net::TcpListener) {
    if let Ok(addr) = listener.local_addr() {
        let tls = if shared.serving.tls.is_some() {
            " over TLS"
        } else {
            ""
        };
        tracing::info!(%addr, "serving KServe v2 over gRPC{tls}");
    }
    let router = router(shared.clone());
    crate::serving::listener::serve(shared, listener, router, "gRPC").await;
}

/// The service as an axum router, behind the token check.
pub fn router(shared: Arc<Shared>) -> axum::Router {
    let limit = usize::try_from(shared.config.http_max_body_bytes).unwrap_or(usize::MAX);
    let service = GrpcInferenceServiceServer::new(Service {
        shared: shared.clone(),
    })
    // Answers are as large as the model makes them (as over HTTP).
    .max_decoding_message_size(limit)
    .max_encoding_message_size(usize::MAX);
    tonic::service::Routes::new(service)
        .into_axum_router()
        .layer(axum::middleware::from_fn(unserved))
        .layer(axum::middleware::from_fn_with_state(
            shared,
            crate::serving::auth::require_token,
        ))
}

/// The service's path prefix.
const SERVICE: &str = "/inference.GRPCInferenceService/";

/// The methods served.
const SERVED: [&str; 9] = [
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelInfer",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
];

/// UNIMPLEMENTED, with a message that says so, for the protocol's methods
/// Tessera does not serve (shared memory, statistics, model config, trace).
async fn unserved(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match request.uri().path().strip_prefix(SERVICE) {
        Some(method) if !SERVED.contains(&method) => Status::unimplemented(format!(
            "{method} is not served by Tessera; it serves {}",
            SERVED.join(", ")
        ))
        .into_http::<axum::body::Body>()
        .into_response(),
        _ => next.run(request).await,
    }
}

/// The coordinator as a `GRPCInferenceService`.
pub struct Service {
    shared: Arc<Shared>,
}

/// A coordinator error as a gRPC status (the codes HTTP's statuses map to).
pub fn status(e: CoordinatorError) -> Status {
    let message = e.to_string();
    match e.kind() {
        ErrorKind::NotFound => Status::not_found(message),
        ErrorKind::BadInput | ErrorKind::Refused => Status::invalid_argument(message),
        ErrorKind::Unavailable | ErrorKind::WorkerLost => Status::unavailable(message),
        ErrorKind::Timeout => Status::deadline_exceeded(message),
        ErrorKind::Worker | ErrorKind::Internal => Status::internal(message),
    }
}

fn serving_status(e: ServingError) -> Status {
    match e {
        ServingError::Coordinator(e) => status(e),
        ServingError::ControlOff => Status::permission_denied(e.to_string()),
        ServingError::BadRequest(m) => Status::invalid_argument(m),
        ServingError::NotFound(m) => Status::not_found(m),
    }
}

/// Only version `1` (or none) exists.
fn check_version(name: &str, version: &str) -> Result<(), Status> {
    if version.is_empty() || version == VERSION {
        Ok(())
    } else {
        Err(Status::not_found(format!(
            "model {name} has no version '{version}' (its one version is {VERSION})"
        )))
    }
}

fn tensor_metadata(
    graph: &tessera_common::graph::Graph,
    tensors: &[tessera_common::graph::TensorId],
) -> Vec<proto::model_metadata_response::TensorMetadata> {
    tensors::metadata(graph, tensors)
        .into_iter()
        .map(
            |(name, datatype, shape)| proto::model_metadata_response::TensorMetadata {
                name,
                datatype: datatype.to_string(),
                shape,
            },
        )
        .collect()
}

/// The `config` parameter of a load request, if any.
fn load_config(
    parameters: &std::collections::HashMap<String, proto::ModelRepositoryParameter>,
) -> Result<Option<String>, Status> {
    use proto::model_repository_parameter::ParameterChoice;
    if let Some(file) = parameters.keys().find(|k| k.starts_with("file:")) {
        return Err(Status::invalid_argument(format!(
            "'{file}': model files in the request are not supported; put the model in the server's model repository"
        )));
    }
    match parameters.get("config").map(|p| &p.parameter_choice) {
        None => Ok(None),
        Some(Some(ParameterChoice::StringParam(text))) => Ok(Some(text.clone())),
        Some(_) => Err(Status::invalid_argument(
            "parameters.config must be a string (the model's settings as JSON)",
        )),
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for Service {
    async fn server_live(
        &self,
        _: Request<proto::ServerLiveRequest>,
    ) -> Result<Response<proto::ServerLiveResponse>, Status> {
        Ok(Response::new(proto::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<proto::ServerReadyRequest>,
    ) -> Result<Response<proto::ServerReadyResponse>, Status> {
        let ready = crate::serving::readiness(&self.shared).is_ok();
        Ok(Response::new(proto::ServerReadyResponse { ready }))
    }

    async fn model_ready(
        &self,
        request: Request<proto::ModelReadyRequest>,
    ) -> Result<Response<proto::ModelReadyResponse>, Status> {
        let r = request.into_inner();
        check_version(&r.name, &r.version)?;
        let entry = self
            .shared
            .repository
            .get(&r.name)
            .ok_or_else(|| status(CoordinatorError::UnknownModel(r.name.clone())))?;
        let ready = repository::status(&self.shared, &entry).state == ModelState::Ready;
        Ok(Response::new(proto::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<proto::ServerMetadataRequest>,
    ) -> Result<Response<proto::ServerMetadataResponse>, Status> {
        Ok(Response::new(proto::ServerMetadataResponse {
            name: "tessera".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: vec!["model_repository".into()],
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<proto::ModelMetadataRequest>,
    ) -> Result<Response<proto::ModelMetadataResponse>, Status> {
        let r = request.into_inner();
        check_version(&r.name, &r.version)?;
        let graph = repository::graph(&self.shared, &r.name)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::ModelMetadataResponse {
            inputs: tensor_metadata(&graph, &graph.inputs),
            outputs: tensor_metadata(&graph, &graph.outputs),
            name: r.name,
            versions: vec![VERSION.into()],
            platform: PLATFORM.into(),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<proto::ModelInferRequest>,
    ) -> Result<Response<proto::ModelInferResponse>, Status> {
        infer::run(&self.shared, request).await.map(Response::new)
    }

    async fn repository_index(
        &self,
        request: Request<proto::RepositoryIndexRequest>,
    ) -> Result<Response<proto::RepositoryIndexResponse>, Status> {
        let only_ready = request.into_inner().ready;
        let models = repository::statuses(&self.shared)
            .into_iter()
            .filter(|s| !only_ready || s.state == ModelState::Ready)
            .map(|s| proto::repository_index_response::ModelIndex {
                name: s.name,
                version: VERSION.into(),
                state: s.state.as_str().into(),
                reason: s.reason,
            })
            .collect();
        Ok(Response::new(proto::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<proto::RepositoryModelLoadRequest>,
    ) -> Result<Response<proto::RepositoryModelLoadResponse>, Status> {
        if !self.shared.serving.model_control {
            return Err(serving_status(ServingError::ControlOff));
        }
        let r = request.into_inner();
        let config = load_config(&r.parameters)?;
        control::load(&self.shared, &r.model_name, config.as_deref())
            .await
            .map_err(serving_status)?;
        Ok(Response::new(proto::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<proto::RepositoryModelUnloadRequest>,
    ) -> Result<Response<proto::RepositoryModelUnloadResponse>, Status> {
        let r = request.into_inner();
        control::unload(&self.shared, &r.model_name)
            .await
            .map_err(serving_status)?;
        Ok(Response::new(proto::RepositoryModelUnloadResponse {}))
    }
}
