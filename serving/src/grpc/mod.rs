//! A front door's gRPC listener: the KServe v2 / Open Inference Protocol's
//! `inference.GRPCInferenceService` (what Triton's and KServe's gRPC
//! clients call), served by tonic on the process's runtime, on the same
//! connection loop, token check and limits as HTTP; a thin codec over
//! [`crate::core`].
//!
//! | method | answer |
//! |---|---|
//! | `ServerLive`, `ServerReady`, `ModelReady` | as HTTP's health endpoints (`ready: false` instead of 503) |
//! | `ServerMetadata`, `ModelMetadata` | as HTTP's (-1 for a dynamic dim) |
//! | `ModelInfer` | inference: `raw_input_contents` or typed `contents` in, `raw_output_contents` out (`infer`) |
//! | `RepositoryIndex`, `RepositoryModelLoad`, `RepositoryModelUnload` | the repository extension, under `[serving]`'s rules |
//!
//! Errors are the HTTP errors' kinds as gRPC codes: INVALID_ARGUMENT (400),
//! NOT_FOUND (404), PERMISSION_DENIED (403: model control off),
//! UNAUTHENTICATED (401), RESOURCE_EXHAUSTED (429: every copy busy),
//! UNAVAILABLE (503), DEADLINE_EXCEEDED,
//! OUT_OF_RANGE (a message over `http_max_body_bytes`: tonic's code), INTERNAL;
//! methods Tessera does not serve answer UNIMPLEMENTED.

mod infer;

use std::sync::Arc;

use tessera_common::wire::control::{ErrorKind, ModelState};
use tessera_common::wire::routes::TensorSig;
use tonic::{Request, Response, Status};

use crate::core::{check_version, PLATFORM, VERSION};
use crate::http::tensors;
use crate::{control, Door, ServeError};

/// The generated protocol types, client and server.
pub mod proto {
    tonic::include_proto!("inference");
}

use proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};

/// Serves gRPC on `listener` until the front door shuts down.
pub async fn serve(door: Arc<Door>, listener: tokio::net::TcpListener) {
    if let Ok(addr) = listener.local_addr() {
        let tls = if door.rules.tls.is_some() {
            " over TLS"
        } else {
            ""
        };
        tracing::info!(%addr, "serving KServe v2 over gRPC{tls}");
    }
    let router = router(door.clone());
    crate::listener::serve(door, listener, router, "gRPC").await;
}

/// The service as an axum router, behind the token check.
pub fn router(door: Arc<Door>) -> axum::Router {
    let limit = usize::try_from(door.limits.max_body_bytes).unwrap_or(usize::MAX);
    let service = GrpcInferenceServiceServer::new(Service { door: door.clone() })
        // Answers are as large as the model makes them (as over HTTP).
        .max_decoding_message_size(limit)
        .max_encoding_message_size(usize::MAX);
    tonic::service::Routes::new(service)
        .into_axum_router()
        .layer(axum::middleware::from_fn(unserved))
        .layer(axum::middleware::from_fn_with_state(
            door,
            crate::auth::require_token,
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

/// A front door as a `GRPCInferenceService`.
pub struct Service {
    door: Arc<Door>,
}

/// An error as a gRPC status (the codes HTTP's statuses map to).
pub fn status(e: ServeError) -> Status {
    let message = e.to_string();
    if let ServeError::ControlOff = e {
        return Status::permission_denied(message);
    }
    match e.kind() {
        ErrorKind::NotFound => Status::not_found(message),
        ErrorKind::BadInput | ErrorKind::Refused => Status::invalid_argument(message),
        ErrorKind::Busy => Status::resource_exhausted(message),
        ErrorKind::Unavailable | ErrorKind::WorkerLost => Status::unavailable(message),
        ErrorKind::Timeout => Status::deadline_exceeded(message),
        ErrorKind::Worker | ErrorKind::Internal => Status::internal(message),
    }
}

fn tensor_metadata(tensors: &[TensorSig]) -> Vec<proto::model_metadata_response::TensorMetadata> {
    tensors::metadata(tensors)
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

/// The `config` parameter of a load request, if any
/// ([`crate::core::load_config`]).
fn load_config(
    parameters: &std::collections::HashMap<String, proto::ModelRepositoryParameter>,
) -> Result<Option<String>, Status> {
    use proto::model_repository_parameter::ParameterChoice;
    let params = parameters.iter().map(|(k, p)| {
        let value = match &p.parameter_choice {
            Some(ParameterChoice::StringParam(text)) => crate::core::LoadParam::Text(text),
            _ => crate::core::LoadParam::Other,
        };
        (k.as_str(), value)
    });
    crate::core::load_config(params).map_err(status)
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
        let ready = self.door.ready().await.is_ok();
        Ok(Response::new(proto::ServerReadyResponse { ready }))
    }

    async fn model_ready(
        &self,
        request: Request<proto::ModelReadyRequest>,
    ) -> Result<Response<proto::ModelReadyResponse>, Status> {
        let r = request.into_inner();
        check_version(&r.name, Some(&r.version)).map_err(status)?;
        let ready = match self.door.model_ready(&r.name).await {
            Ok(()) => true,
            Err(ServeError::NotFound(m)) => return Err(Status::not_found(m)),
            Err(_) => false,
        };
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
        check_version(&r.name, Some(&r.version)).map_err(status)?;
        let table = self.door.table(&r.name).await.map_err(status)?;
        Ok(Response::new(proto::ModelMetadataResponse {
            inputs: tensor_metadata(&table.signature.inputs),
            outputs: tensor_metadata(&table.signature.outputs),
            name: r.name,
            versions: vec![VERSION.into()],
            platform: PLATFORM.into(),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<proto::ModelInferRequest>,
    ) -> Result<Response<proto::ModelInferResponse>, Status> {
        infer::run(&self.door, request).await.map(Response::new)
    }

    async fn repository_index(
        &self,
        request: Request<proto::RepositoryIndexRequest>,
    ) -> Result<Response<proto::RepositoryIndexResponse>, Status> {
        let only_ready = request.into_inner().ready;
        let models = self
            .door
            .index()
            .await
            .map_err(status)?
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
        if !self.door.rules.model_control {
            return Err(status(ServeError::ControlOff));
        }
        let r = request.into_inner();
        let config = load_config(&r.parameters)?;
        control::load(&self.door, &r.model_name, config.as_deref())
            .await
            .map_err(status)?;
        Ok(Response::new(proto::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<proto::RepositoryModelUnloadRequest>,
    ) -> Result<Response<proto::RepositoryModelUnloadResponse>, Status> {
        let r = request.into_inner();
        control::unload(&self.door, &r.model_name)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::RepositoryModelUnloadResponse {}))
    }
}
