//! Coordinator ↔ workers. The coordinator's operations on a worker, one per
//! stream it opens ([`ToWorker`]), and the worker's answers
//! ([`WorkerAnswer`]); what a worker reports on its control stream
//! ([`WorkerReport`]: registration, then heartbeats with what its
//! deployments did, aggregated) and the coordinator's answer to its
//! registration ([`CoordinatorAnswer`]). No request passes here: requests
//! go from requesters to workers ([`super::data`]).

use serde::{Deserialize, Serialize};

use super::control::{
    CompileCounts, DeploySpec, DeviceAnswer, DeviceInfo, HeldSubgraph, LinkRate, SequenceLoad,
    SubgraphLoad,
};
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
}

channel!(
    ToWorker,
    "coordinator operation",
    [QueryNetwork, Deploy, Model, Undeploy]
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
        Undeployed
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
    /// address and devices, and what it still holds from an earlier
    /// session (a coordinator that restarted or took over adopts it
    /// instead of deploying again).
    Register {
        name: String,
        data_addr: String,
        devices: Vec<DeviceInfo>,
        /// Every subgraph it serves now: deployment, subgraph, model hash.
        holds: Vec<HeldSubgraph>,
        /// Its deployments' live sequences.
        sequences: Vec<SequenceLoad>,
        /// Its compiles and compile-cache loads since it started.
        compiles: CompileCounts,
    },
    /// Every heartbeat: what its deployments did since it started
    /// (counters) and hold now, aggregated; no per-request message.
    Heartbeat {
        seq: u64,
        /// Subgraph runs under way.
        in_flight: u32,
        /// Each subgraph actor's load.
        subgraphs: Vec<SubgraphLoad>,
        /// Each stateful deployment's sequences.
        sequences: Vec<SequenceLoad>,
        /// Tensors received from each peer.
        links: Vec<LinkRate>,
        /// The process's resident memory, bytes (0: not known).
        rss_bytes: u64,
        /// Its compiles and compile-cache loads since it started.
        compiles: CompileCounts,
    },
}

channel!(WorkerReport, "worker report", [Register, Heartbeat]);

/// The coordinator's answer to a worker's `Register`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoordinatorAnswer {
    /// Welcome; heartbeats are expected this often. `adopted`: the
    /// deployments of its `holds` the coordinator serves (the worker
    /// unloads the others); `epoch`: the coordinator's.
    Registered {
        heartbeat_ms: u64,
        adopted: Vec<u64>,
        epoch: u64,
    },
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
