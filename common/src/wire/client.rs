//! Clients ↔ coordinator: what a client may ask ([`ClientRequest`], one
//! operation per stream) and what the coordinator answers
//! ([`ClientReply`]). A request that describes a model carries it as the
//! frame's payload; `Infer` and `InferDone` are followed by tensor frames
//! on the same stream.

use serde::{Deserialize, Serialize};

use super::control::{Counters, DeviceAnswer, ErrorKind, LoadRequest, ModelStatus, WorkerState};
use super::generate::{GenerateParams, GenerateStats, Prompt};
use super::message::{channel, Failure, Progress, Reply, Status};
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
    /// A request; `inputs` tensor frames follow on the same stream.
    Infer {
        network: u64,
        request: u64,
        inputs: u32,
        deadline_ms: u64,
    },
    /// Generate text on a generative network; answered by `Tokens` as they
    /// come, then `Generated`.
    Generate {
        network: u64,
        prompt: Prompt,
        params: GenerateParams,
    },
    Unload {
        network: u64,
    },
}

channel!(
    ClientRequest,
    "client request",
    [
        QueryNetwork,
        LoadNetwork,
        LoadModel,
        UnloadModel,
        ListModels,
        ClusterInfo,
        Infer,
        Generate,
        Unload
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
    },
    /// A request's results; `outputs` tensor frames follow.
    InferDone {
        network: u64,
        request: u64,
        outputs: u32,
        counters: Counters,
        /// The deployment that answered (a network is re-deployed when it
        /// loses a worker).
        deployment: u64,
        /// Tries it took (more than one: retried after a worker was lost).
        attempts: u32,
    },
    /// New tokens of a generation and their text.
    Tokens {
        ids: Vec<u32>,
        text: String,
    },
    Generated(GenerateStats),
    Unloaded {
        network: u64,
    },
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
        InferDone,
        Tokens,
        Generated,
        Unloaded
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
