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

/// The coordinator's operations on a worker. Each carries the epoch of
/// the coordinator that sends it: a worker refuses one older than the
/// newest epoch it knows (a coordinator that lost its lead, say paused
/// past its lease, changes nothing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToWorker {
    /// Which nodes of the payload model can these device kinds run?
    QueryNetwork { devices: Vec<String>, epoch: u64 },
    /// Compile and serve a subgraph (its model follows only if the worker
    /// answers [`WorkerAnswer::NeedModel`]).
    Deploy { spec: Box<DeploySpec>, epoch: u64 },
    /// After `NeedModel`: the subgraph's model is the payload, less the
    /// weights the worker holds (on the `Deploy`'s stream: its epoch; see
    /// [`super::pieces`]).
    Model,
    /// Stop a deployment's subgraphs.
    Undeploy { network: u64, epoch: u64 },
    /// Which of these large weights (by SHA-256) does the worker hold? It
    /// answers [`WorkerAnswer::Weights`] with their bytes: a coordinator
    /// that lost a model's bytes takes them back (see
    /// [`crate::onnx::bones`]). `source`: where the model was read from,
    /// which the worker may read on its own disk.
    Weights {
        sha256: Vec<String>,
        source: Option<String>,
        epoch: u64,
    },
}

impl ToWorker {
    /// The sender's epoch (none: a follow-up on an operation's stream).
    pub fn epoch(&self) -> Option<u64> {
        match self {
            ToWorker::QueryNetwork { epoch, .. }
            | ToWorker::Deploy { epoch, .. }
            | ToWorker::Undeploy { epoch, .. }
            | ToWorker::Weights { epoch, .. } => Some(*epoch),
            ToWorker::Model => None,
        }
    }
}

channel!(
    ToWorker,
    "coordinator operation",
    [QueryNetwork, Deploy, Model, Undeploy, Weights]
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
    /// the model's frames and the weights it lacks (indices into the
    /// spec's `pieces`, ascending).
    NeedModel {
        missing: Vec<u32>,
    },
    Deployed {
        network: u64,
        subgraph: u32,
        compile_ms: u64,
        cached: bool,
    },
    Undeployed {
        network: u64,
    },
    /// To [`ToWorker::Weights`]: the indices of the weights asked for that
    /// this worker holds, ascending; the payload is their bytes, in that
    /// order.
    Weights {
        held: Vec<u32>,
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
        Undeployed,
        Weights
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
    /// The first message of a stream on which a worker only follows who
    /// leads (HA): answered by `Leading` or `Standby` now and again at
    /// every change, until the stream ends.
    WatchLeader { name: String },
    /// The worker is leaving (SIGTERM): the coordinator plans around it,
    /// deploys what runs there elsewhere while it finishes what it holds,
    /// undeploys the old deployments once idle, then closes its session.
    Draining,
}

channel!(
    WorkerReport,
    "worker report",
    [Register, Heartbeat, WatchLeader, Draining]
);

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
    /// This coordinator is a standby (HA): `leader` leads (its address,
    /// when one does) with `epoch`. Answers a `Register`, and a
    /// `WatchLeader` at every change.
    Standby { leader: Option<String>, epoch: u64 },
    /// On a `WatchLeader` stream: this coordinator leads now, with `epoch`
    /// (register with it).
    Leading { epoch: u64 },
}

channel!(
    CoordinatorAnswer,
    "registration answer",
    [Registered, Failed, Standby, Leading]
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
