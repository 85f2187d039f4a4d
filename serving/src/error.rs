//! Why a front door's call failed, with the kind both codecs map to a
//! status: HTTP's (400, 403, 404, 429, 503, 500) and gRPC's codes.

use tessera_client::ClientError;
use tessera_common::wire::control::ErrorKind;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("model control is off on this server: loading and unloading models over HTTP and gRPC is refused unless its configuration sets [serving] model_control = true (or TESSERA_SERVING_MODEL_CONTROL=true)")]
    ControlOff,
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unavailable(String),
    /// The cluster's own error.
    #[error("{0}")]
    Cluster(String, ErrorKind),
}

impl ServeError {
    /// The kind a caller can match on (and the status it maps to).
    pub fn kind(&self) -> ErrorKind {
        match self {
            ServeError::ControlOff => ErrorKind::Refused,
            ServeError::BadRequest(_) => ErrorKind::BadInput,
            ServeError::NotFound(_) => ErrorKind::NotFound,
            ServeError::Unavailable(_) => ErrorKind::Unavailable,
            ServeError::Cluster(_, kind) => *kind,
        }
    }
}

impl From<ClientError> for ServeError {
    fn from(e: ClientError) -> ServeError {
        let kind = e.kind();
        let message = match e {
            ClientError::Failed { message, .. } => message,
            other => other.to_string(),
        };
        ServeError::Cluster(message, kind)
    }
}

/// The HTTP status of an error kind.
pub fn http_status(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::NotFound => 404,
        ErrorKind::BadInput => 400,
        ErrorKind::Refused => 400,
        ErrorKind::Busy => 429,
        ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::WorkerLost => 503,
        ErrorKind::Worker | ErrorKind::Internal => 500,
    }
}
