//! Clients ↔ coordinator: what a client may ask ([`ClientRequest`], one
//! operation per stream) and what the coordinator answers
//! ([`ClientReply`]). A request that describes a model carries it as the
//! frame's payload. Requests themselves never come here: a client takes a
//! network's routing table (`Routes`) and sends them to the workers
//! ([`super::data`]).

use serde::{Deserialize, Serialize};

use super::control::{
    CoordinatorInfo, DeviceAnswer, ErrorKind, LoadRequest, ModelStatus, WorkerState,
};
use super::embed::EmbeddingSpec;
use super::generate::GenerationSpec;
use super::message::{channel, Failure, Progress, Reply, Status};
use super::routes::RoutingTable;
use crate::dump::PlanReport;

/// What a client asks the coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClientRequest {
    /// Which nodes of the payload model can these devices run (`host/DEVICE`
    /// names or a priority string)?
    QueryNetwork {
        devices: Vec<String>,
    },
    /// Plan and deploy the payload model (or only plan: `dry_run`).
    LoadNetwork(LoadRequest),
    /// [`ClientRequest::LoadNetwork`] of model bytes the coordinator may
    /// have already (a load of the same model before), named by their
    /// SHA-256 (hex): the payload carries only what follows the model (a
    /// tokenizer). Answered as `LoadNetwork` is, or by `ModelUnknown` when
    /// the coordinator has no such bytes (the client then sends them).
    LoadKnown {
        request: LoadRequest,
        model_sha256: String,
    },
    /// Load model `name`: with a request, defined anew from the payload's
    /// ONNX bytes (replacing a model of that name once deployed); without,
    /// the repository's model of that name.
    LoadModel {
        name: String,
        request: Option<LoadRequest>,
    },
    UnloadModel {
        name: String,
    },
    ListModels,
    /// The cluster's workers.
    ClusterInfo,
    /// Subscribe to a network's routing table: answered by `Routes` now
    /// and again at every change, until the network is unloaded
    /// (`Unloaded`) or the stream is dropped. With `model`, the table of
    /// whichever network serves that named model (a model loaded again
    /// continues on the same stream with its new network).
    Routes {
        network: u64,
        model: Option<String>,
    },
    /// A generative network's tokenizer, chat template and limits:
    /// answered by `Generation` with `tokenizer.json` as its payload.
    Generation {
        network: u64,
    },
    Unload {
        network: u64,
    },
    /// Which coordinator leads: answered by `Coordinators`, by a standby
    /// too (every other operation a standby answers `NotLeader`).
    Leader,
    /// A loaded network's plan, with its subgraphs' measured runs:
    /// answered by `NetworkLoaded`.
    Plan {
        network: u64,
    },
    /// An embedding network's tokenizer and pooling: answered by
    /// `Embedding` with `tokenizer.json` as its payload.
    Embedding {
        network: u64,
    },
    /// Model bytes a client sent, by their SHA-256 (hex), as the
    /// coordinator keeps them: answered by `KeptModel` with the bytes as
    /// its payload. A standby asks the leader, so that it takes over
    /// without a volume shared with it. A standby serves it too.
    KeptModel {
        sha256: String,
    },
    /// To a standby, from the leader: copy these model bytes now (asking
    /// the leader with `KeptModel` unless this coordinator has them);
    /// answered by `Copied` once they are kept.
    CopyModel {
        sha256: String,
    },
}

channel!(
    ClientRequest,
    "client request",
    [
        QueryNetwork,
        LoadNetwork,
        LoadKnown,
        LoadModel,
        UnloadModel,
        ListModels,
        ClusterInfo,
        Routes,
        Generation,
        Unload,
        Leader,
        Plan,
        Embedding,
        KeptModel,
        CopyModel
    ]
);

/// What the coordinator answers a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClientReply {
    /// Long work under way (deploying, shipping a model).
    Progress(Progress),
    /// The operation (or request) failed.
    Failed(Failure),
    QueryResult {
        answers: Vec<DeviceAnswer>,
    },
    /// The plan (the partition's report, with where each copy runs).
    NetworkLoaded {
        network: u64,
        #[serde(with = "super::plan_json")]
        plan: Box<PlanReport>,
    },
    ModelUnloaded {
        name: String,
    },
    Models {
        models: Vec<ModelStatus>,
    },
    ClusterState {
        workers: Vec<WorkerState>,
        networks: u32,
        in_flight: u32,
        /// The coordinators: the leader first, then the standbys.
        coordinators: Vec<CoordinatorInfo>,
    },
    /// A network's routing table (on a `Routes` stream, again at every
    /// change).
    Routes(Box<RoutingTable>),
    /// A generative network's spec; the payload is its `tokenizer.json`
    /// (`tokenizer_bytes` long).
    Generation(Box<GenerationSpec>),
    Unloaded {
        network: u64,
    },
    /// Whether this coordinator leads, and who does.
    Coordinators {
        /// This one leads (its operations are served here).
        leading: bool,
        /// The leader's address, when one leads.
        leader: Option<String>,
        /// The leader's epoch (0: none leads).
        epoch: u64,
        /// Every coordinator known: the leader first, then the standbys.
        coordinators: Vec<CoordinatorInfo>,
    },
    /// This coordinator is a standby: ask `leader` (none leads now: ask
    /// again shortly).
    NotLeader {
        leader: Option<String>,
    },
    /// An embedding network's spec; the payload is its `tokenizer.json`
    /// (`tokenizer_bytes` long).
    Embedding(Box<EmbeddingSpec>),
    /// The model bytes asked for are the payload.
    KeptModel,
    /// The model bytes a `CopyModel` named are kept here.
    Copied,
    /// The coordinator has no model bytes with the SHA-256 a `LoadKnown`
    /// named: send them (`LoadNetwork`).
    ModelUnknown,
}

channel!(
    ClientReply,
    "coordinator reply",
    [
        Progress,
        Failed,
        QueryResult,
        NetworkLoaded,
        ModelUnloaded,
        Models,
        ClusterState,
        Routes,
        Generation,
        Unloaded,
        Coordinators,
        NotLeader,
        Embedding,
        KeptModel,
        Copied,
        ModelUnknown
    ]
);

impl Reply for ClientReply {
    fn status(self) -> Status<ClientReply> {
        match self {
            ClientReply::Progress(p) => Status::Progress(p),
            ClientReply::Failed(f) => Status::Failed(f),
            answer => Status::Answer(answer),
        }
    }

    fn failed(failure: Failure) -> ClientReply {
        ClientReply::Failed(failure)
    }
}

impl ClientReply {
    /// The failure of an operation, as its answer.
    pub fn failure(kind: ErrorKind, error: impl Into<String>) -> ClientReply {
        ClientReply::Failed(Failure::of_operation(kind, error))
    }
}
