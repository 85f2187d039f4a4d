//! What can go wrong, with the kind a caller can match on.

use tessera_common::wire::control::ErrorKind;
use tessera_net::{ExchangeError, NetError};

/// An operation the client asks of the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Load,
    Plan,
    Query,
    Infer,
    Unload,
    LoadModel,
    UnloadModel,
    ListModels,
    ClusterInfo,
    Generate,
    Embed,
    Routes,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operation::Load => "loading the network",
            Operation::Plan => "planning the network",
            Operation::Query => "QueryNetwork",
            Operation::Infer => "request",
            Operation::Unload => "unload",
            Operation::LoadModel => "loading the model",
            Operation::UnloadModel => "unloading the model",
            Operation::ListModels => "listing the models",
            Operation::ClusterInfo => "reading the cluster's state",
            Operation::Generate => "generation",
            Operation::Embed => "embedding",
            Operation::Routes => "following the network's routing table",
        })
    }
}

/// What can go wrong, by kind: [`ClientError::kind`] tells a timeout from
/// a lost worker, bad input or a refusal.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the coordinator: {0}")]
    Connect(#[source] NetError),
    /// The coordinator failed or refused the operation.
    #[error("{op} failed: {message}")]
    Failed {
        op: Operation,
        kind: ErrorKind,
        message: String,
    },
    #[error("bad tensor: {0}")]
    Tensor(String),
    /// A model (folder) that cannot be read or used.
    #[error("model {0}")]
    Model(String),
    #[error("connection to the coordinator: {0}")]
    Connection(String),
    /// The connection to the coordinator or one of its streams failed
    /// (see [`NetError::Stream`] for which), or a frame broke the protocol.
    #[error("connection to the coordinator: {0}")]
    Transport(#[source] NetError),
    /// A worker's data address could not be reached.
    #[error("cannot reach worker {worker}: {source}")]
    Unreachable {
        worker: String,
        #[source]
        source: NetError,
    },
    /// A worker's data address answered as another node (`answer` says
    /// which).
    #[error("cannot reach worker {worker}: {answer}")]
    NotTheWorker { worker: String, answer: String },
    #[error("protocol: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The failure's kind: the coordinator's for a failed operation;
    /// `Unavailable` when the coordinator cannot be reached, `BadInput` for
    /// a tensor that cannot be sent, `Internal` for a protocol breach.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClientError::Failed { kind, .. } => *kind,
            ClientError::Connect(_)
            | ClientError::Connection(_)
            | ClientError::Transport(_)
            | ClientError::Unreachable { .. }
            | ClientError::NotTheWorker { .. } => ErrorKind::Unavailable,
            ClientError::Tensor(_) | ClientError::Model(_) => ErrorKind::BadInput,
            ClientError::Protocol(_) => ErrorKind::Internal,
        }
    }

    /// The error of an exchange for `op`.
    pub(crate) fn of(op: Operation, e: ExchangeError) -> ClientError {
        match e {
            ExchangeError::Failed { kind, error } => ClientError::Failed {
                op,
                kind,
                message: error,
            },
            ExchangeError::Net(e) => ClientError::Transport(e),
            ExchangeError::NoAnswer => ClientError::Connection(e.to_string()),
            ExchangeError::Unexpected(what) => ClientError::Protocol(format!("unexpected {what}")),
        }
    }

    /// An answer that is not the one `op` expects.
    pub(crate) fn unexpected(
        op: Operation,
        answer: &tessera_common::wire::client::ClientReply,
    ) -> ClientError {
        use tessera_common::wire::Message;
        ClientError::Protocol(format!("{op}: unexpected {}", answer.name()))
    }
}
