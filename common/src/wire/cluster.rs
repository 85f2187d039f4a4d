//! Coordinator ↔ workers. The coordinator's operations on a worker, one per
//! stream it opens ([`ToWorker`]), and the worker's answers
//! ([`WorkerAnswer`]); what a worker reports on the streams it opens
//! ([`WorkerReport`]: registration and heartbeats on its control stream,
//! timings and transfers beside its outputs on its data streams) and the
//! coordinator's answer to its registration ([`CoordinatorAnswer`]).

use serde::{Deserialize, Serialize};

use super::control::{DeploySpec, DeviceAnswer, DeviceInfo, MailboxDepth, NodeTime, Transfer};
use super::message::{channel, Failure, Progress, Reply, Status};

/// The coordinator's operations on a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToWorker {
    /// Which nodes of the payload model can these device kinds run?
    QueryNetwork { devices: Vec<String> },
    /// Compile and serve a subgraph (its model follows only if the worker
    /// answers [`WorkerAnswer::NeedModel`]).
    Deploy(DeploySpec),
    /// After `NeedModel`: the subgraph's model is the payload.
    Model,
    /// Stop a deployment's subgraphs.
    Undeploy { network: u64 },
    /// A request failed; drop what it left behind.
    Cancel { request: u64 },
    /// A sequence ended; free its state.
    EndSequence { network: u64, sequence: u64 },
}

channel!(
    ToWorker,
    "coordinator operation",
    [QueryNetwork, Deploy, Model, Undeploy, Cancel, EndSequence]
);

/// A worker's answers to [`ToWorker`] operations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerAnswer {
    /// Compiling, on a `Deploy` stream.
    Progress(Progress),
    Failed(Failure),
    QueryResult {
        answers: Vec<DeviceAnswer>,
    },
    /// On a `Deploy` stream: its compile cache lacks the subgraph; send
    /// the model.
    NeedModel,
    Deployed {
        network: u64,
        subgraph: u32,
        compile_ms: u64,
        cached: bool,
    },
    Undeployed {
        network: u64,
    },
    /// `Cancel` and `EndSequence` done.
    Done,
}

channel!(
    WorkerAnswer,
    "worker answer",
    [
        Progress,
        Failed,
        QueryResult,
        NeedModel,
        Deployed,
        Undeployed,
        Done
    ]
);

impl Reply for WorkerAnswer {
    fn status(self) -> Status<WorkerAnswer> {
        match self {
            WorkerAnswer::Progress(p) => Status::Progress(p),
            WorkerAnswer::Failed(f) => Status::Failed(f),
            answer => Status::Answer(answer),
        }
    }

    fn failed(failure: Failure) -> WorkerAnswer {
        WorkerAnswer::Failed(failure)
    }
}

/// What a worker tells the coordinator on the streams it opens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerReport {
    /// The first message of its control stream: its name, data-plane
    /// address and devices.
    Register {
        name: String,
        data_addr: String,
        devices: Vec<DeviceInfo>,
    },
    Heartbeat {
        seq: u64,
        in_flight: u32,
        /// Requests waiting in or handed on by each subgraph actor's mailbox.
        mailboxes: Vec<MailboxDepth>,
        /// The process's resident memory, bytes (0: not known).
        rss_bytes: u64,
    },
    /// On a data stream: it ran one subgraph of a request; `nodes` when its
    /// plugin counts per node (`PERF_COUNT`).
    Ran {
        request: u64,
        subgraph: u32,
        micros: u64,
        nodes: Vec<NodeTime>,
    },
    /// On a data stream: a tensor of a request arrived (reported by its
    /// receiver).
    Moved(Transfer),
    /// A tensor of `request` could not be streamed to its consumer (a peer
    /// unreachable); the coordinator retries the request if the peer turns
    /// out to be lost.
    Unreachable { request: u64, error: String },
    /// A request failed on this worker.
    Failed(Failure),
}

channel!(
    WorkerReport,
    "worker report",
    [Register, Heartbeat, Ran, Moved, Unreachable, Failed]
);

/// The coordinator's answer to a worker's `Register`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoordinatorAnswer {
    /// Welcome; heartbeats are expected this often.
    Registered { heartbeat_ms: u64 },
    /// Refused (the name is taken, the certificate names another node).
    Failed(Failure),
}

channel!(
    CoordinatorAnswer,
    "registration answer",
    [Registered, Failed]
);

impl Reply for CoordinatorAnswer {
    fn status(self) -> Status<CoordinatorAnswer> {
        match self {
            CoordinatorAnswer::Failed(f) => Status::Failed(f),
            answer => Status::Answer(answer),
        }
    }

    fn failed(failure: Failure) -> CoordinatorAnswer {
        CoordinatorAnswer::Failed(failure)
    }
}
