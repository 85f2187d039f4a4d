//! Control messages, by family: membership (workers → coordinator),
//! QueryNetwork and deployment (coordinator → workers), networks and
//! requests (clients ↔ coordinator, and failures along the data plane).
//! A message that describes a model carries it as the frame's payload.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::frame::{FrameKind, Limits};
use super::generate::{GenerateParams, GenerateStats, GenerationSpec, Prompt};
use super::{codec, WireError};
use crate::affinity::Policy;
use crate::dump::PlanReport;
pub use crate::graph::StatePair;
use crate::plan::ReportedType;
pub use crate::schedule::Replicas;

/// One device of a worker, with the figures the cost policy uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `CPU`, `GPU`, ...
    pub device: String,
    pub full_name: String,
    pub gflops: f64,
    pub bandwidth_gbps: f64,
    /// Memory it offers for models, bytes: the worker's limit, else what
    /// the device has available (0: not reported, not limited).
    pub memory_bytes: u64,
    /// Other metrics by name, printable.
    pub metrics: Vec<(String, String)>,
}

/// Where a subgraph output goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Destination {
    /// Another worker's data-plane address (worker-to-worker streaming).
    Worker { name: String, addr: String },
    /// A final output: back to the coordinator.
    Coordinator,
}

/// A subgraph output and its consumers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub tensor: String,
    pub to: Vec<Destination>,
}

/// A subgraph to compile and serve. Its model follows on the same stream
/// only if the worker asks for it ([`Control::NeedModel`]): a worker whose
/// compile cache holds the hash compiles nothing and receives nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploySpec {
    pub network: u64,
    pub subgraph: u32,
    pub device: String,
    /// SHA-256 of the model, hex: the worker's compile-cache key.
    pub model_hash: String,
    /// The model's size in bytes.
    pub model_bytes: u64,
    pub inputs: Vec<String>,
    pub outputs: Vec<Route>,
    /// Requests waiting in its mailbox run as one batch (absent: one at a
    /// time).
    pub batching: Option<Batching>,
    /// State pairs whose state this subgraph keeps per sequence (its input
    /// and output both).
    pub state: Vec<StatePair>,
    /// Sequences it keeps state for at once (0: no limit).
    pub max_sequences: u32,
}

/// Dynamic batching: requests waiting for a subgraph are concatenated
/// along their first (batch) dimension, run once and split back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batching {
    /// The most requests in one batch (at least 2 to batch at all).
    pub max_batch: u32,
    /// How long a request may wait for others to join its batch, µs.
    pub max_queue_delay_us: u64,
}

/// QueryNetwork's answer for one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAnswer {
    pub device: String,
    pub supported: Vec<String>,
    /// Node and why not.
    pub unsupported: Vec<(String, String)>,
    /// Intermediate tensors the model leaves untyped or unranked, as the
    /// backend's own analysis found them.
    pub types: Vec<TypeReport>,
}

/// A tensor's element type and shape as a backend's own analysis found
/// them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeReport {
    pub tensor: String,
    pub found: ReportedType,
}

/// What a client asks when it loads a network (its model is the payload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadRequest {
    pub name: String,
    /// A device priority, e.g. `HETERO:node-a/GPU.0,node-b/CPU`.
    pub devices: String,
    pub policy: Policy,
    pub strict: bool,
    /// Manual affinity: node name → device.
    pub affinity: Vec<(String, String)>,
    /// Plan only: answer with the plan, deploy nothing.
    pub dry_run: bool,
    /// Concrete shapes of graph inputs (name, dims): dynamic dims fixed
    /// before simplification; requests must then have these shapes.
    pub shapes: Vec<(String, Vec<u64>)>,
    /// Copies of the network to run, requests balanced over them.
    pub replicas: Replicas,
    /// Dynamic batching (absent: off); the model's batch dimension must be
    /// dynamic.
    pub batching: Option<Batching>,
    /// A generative network: its tokenizer and limits (absent: requests
    /// only).
    pub generation: Option<GenerationSpec>,
}

/// One worker as the coordinator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerState {
    pub name: String,
    pub data_addr: String,
    pub devices: Vec<DeviceInfo>,
    /// Since its last message.
    pub silent_ms: u64,
    /// Round-trip time the coordinator measures.
    pub rtt_us: u64,
    /// Link bandwidth the coordinator measured, GB/s (0: not yet).
    pub bandwidth_gbps: f64,
    /// Networks with subgraphs on it.
    pub networks: Vec<u64>,
    /// Subgraph runs under way at its last heartbeat.
    pub running: u32,
    /// What the networks deployed on it need, per device kind, bytes (as
    /// the planner counts it against each device's offer).
    pub memory_in_use: Vec<(String, u64)>,
    /// The worker process's resident memory at its last heartbeat, bytes
    /// (0: not reported).
    pub rss_bytes: u64,
}

/// One node's time in one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTime {
    pub node: String,
    pub micros: u64,
}

/// One tensor moved between two nodes of the cluster for a request: its
/// receiver's time from the frame's first byte to its last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    pub request: u64,
    pub tensor: String,
    pub from: String,
    pub to: String,
    pub bytes: u64,
    pub micros: u64,
}

/// How many requests one subgraph actor holds (waiting for inputs, ready,
/// or computing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxDepth {
    /// The deployment (network id on the wire to workers).
    pub network: u64,
    pub subgraph: u32,
    pub depth: u32,
}

/// A named model's state: shown (and served over HTTP) as `READY`,
/// `LOADING`, `UNAVAILABLE` or `UNLOADED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModelState {
    /// Deployed: requests are served.
    Ready,
    /// Being deployed, or re-planned after a worker loss.
    Loading,
    /// Wanted but not deployed (the status's reason says why).
    Unavailable,
    /// Unloaded on request.
    Unloaded,
}

impl ModelState {
    /// The KServe v2 / Triton name of the state.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Ready => "READY",
            ModelState::Loading => "LOADING",
            ModelState::Unavailable => "UNAVAILABLE",
            ModelState::Unloaded => "UNLOADED",
        }
    }
}

impl std::fmt::Display for ModelState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A named model of the coordinator's repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelStatus {
    pub name: String,
    pub state: ModelState,
    /// The network serving it (0: none).
    pub network: u64,
    /// Why it is not ready, where known.
    pub reason: String,
}

/// A request's performance counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// (subgraph, compute µs) for each subgraph that ran.
    pub subgraphs: Vec<(u32, u64)>,
    /// (subgraph, node time) where plugins count per node.
    pub nodes: Vec<(u32, NodeTime)>,
    /// Every tensor moved, coordinator and workers alike.
    pub transfers: Vec<Transfer>,
}

/// What kind of failure a [`Control::Failed`] reports: what a caller can
/// match on (the message says the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The caller's input is wrong: a malformed model, an unknown device,
    /// a request's missing or ill-shaped tensors.
    BadInput,
    /// No such network or named model.
    NotFound,
    /// The request missed its deadline.
    Timeout,
    /// A worker the operation needed was lost (and retrying did not help).
    WorkerLost,
    /// Refused: the plan cannot place the model as asked (strict, manual
    /// affinity to a device that cannot run a node).
    Refused,
    /// Not available now: a named model waiting for its workers, a peer
    /// that cannot be reached.
    Unavailable,
    /// A worker failed to compile or run a subgraph.
    Worker,
    /// Anything else (I/O, the peer's protocol).
    Internal,
}

impl ErrorKind {
    /// A name for logs and metrics (`bad_input`, `timeout`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadInput => "bad_input",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Timeout => "timeout",
            ErrorKind::WorkerLost => "worker_lost",
            ErrorKind::Refused => "refused",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Worker => "worker",
            ErrorKind::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Control messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Control {
    // Membership.
    /// A worker joins: its name, data-plane address and devices.
    Register {
        name: String,
        data_addr: String,
        devices: Vec<DeviceInfo>,
    },
    Registered {
        heartbeat_ms: u64,
    },
    Heartbeat {
        seq: u64,
        in_flight: u32,
        /// Requests waiting in or handed on by each subgraph actor's mailbox.
        mailboxes: Vec<MailboxDepth>,
        /// The process's resident memory, bytes (0: not known).
        rss_bytes: u64,
    },

    // QueryNetwork and deployment.
    /// Which nodes of the payload model can these devices run? (A client
    /// asks the coordinator with `host/DEVICE` names or a priority string;
    /// the coordinator asks each worker with its device kinds.)
    QueryNetwork {
        devices: Vec<String>,
    },
    QueryResult {
        answers: Vec<DeviceAnswer>,
    },
    Deploy(DeploySpec),
    /// Worker → coordinator, on a `Deploy` stream: its compile cache lacks
    /// the subgraph; send the model.
    NeedModel,
    /// Coordinator → worker, after `NeedModel`: the subgraph's model is the
    /// payload.
    Model,
    /// Long work under way (compiling, shipping a model).
    Progress {
        what: String,
        done: u64,
        total: u64,
    },
    Deployed {
        network: u64,
        subgraph: u32,
        compile_ms: u64,
        cached: bool,
    },
    Undeploy {
        network: u64,
    },

    // Networks and requests.
    LoadNetwork(LoadRequest),
    /// The plan (the partition's report, with where each copy runs).
    NetworkLoaded {
        network: u64,
        #[serde(with = "super::plan_json")]
        plan: Box<PlanReport>,
    },
    /// A request; `inputs` tensor frames follow on the same stream.
    Infer {
        network: u64,
        request: u64,
        inputs: u32,
        deadline_ms: u64,
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
    Unload {
        network: u64,
    },
    /// The answer to `Unload`.
    Unloaded {
        network: u64,
    },
    /// A worker ran one subgraph of a request (per-request counters);
    /// `nodes` when its plugin counts per node (`PERF_COUNT`).
    Ran {
        request: u64,
        subgraph: u32,
        micros: u64,
        nodes: Vec<NodeTime>,
    },
    /// A tensor of a request arrived (reported by its receiver).
    Moved(Transfer),
    /// Coordinator → workers: a request failed; drop what it left behind.
    Cancel {
        request: u64,
    },
    // Named models (the model repository).
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
    /// The answer to `UnloadModel`.
    ModelUnloaded {
        name: String,
    },
    ListModels,
    Models {
        models: Vec<ModelStatus>,
    },
    /// Client → coordinator: the cluster's workers.
    ClusterInfo,
    ClusterState {
        workers: Vec<WorkerState>,
        networks: u32,
        in_flight: u32,
    },
    // Text generation.
    /// Client → coordinator: generate text on a generative network;
    /// answered by `Tokens` as they come, then `Generated`.
    Generate {
        network: u64,
        prompt: Prompt,
        params: GenerateParams,
    },
    /// New tokens of a generation and their text.
    Tokens {
        ids: Vec<u32>,
        text: String,
    },
    Generated(GenerateStats),
    /// Coordinator → workers: a sequence ended; free its state.
    EndSequence {
        network: u64,
        sequence: u64,
    },
    /// Worker → coordinator: a tensor of `request` could not be streamed to
    /// its consumer (a peer unreachable); the coordinator retries the
    /// request if the peer turns out to be lost.
    Unreachable {
        request: u64,
        error: String,
    },
    /// Something failed: a request (if given) or the operation this stream
    /// carried.
    Failed {
        request: Option<u64>,
        kind: ErrorKind,
        error: String,
    },
}

impl Control {
    /// The message's name, for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Control::Register { .. } => "Register",
            Control::Registered { .. } => "Registered",
            Control::Heartbeat { .. } => "Heartbeat",
            Control::QueryNetwork { .. } => "QueryNetwork",
            Control::QueryResult { .. } => "QueryResult",
            Control::Deploy(_) => "Deploy",
            Control::NeedModel => "NeedModel",
            Control::Model => "Model",
            Control::Progress { .. } => "Progress",
            Control::Deployed { .. } => "Deployed",
            Control::Undeploy { .. } => "Undeploy",
            Control::LoadNetwork(_) => "LoadNetwork",
            Control::NetworkLoaded { .. } => "NetworkLoaded",
            Control::Infer { .. } => "Infer",
            Control::InferDone { .. } => "InferDone",
            Control::Unload { .. } => "Unload",
            Control::Unloaded { .. } => "Unloaded",
            Control::Ran { .. } => "Ran",
            Control::Moved(_) => "Moved",
            Control::Cancel { .. } => "Cancel",
            Control::LoadModel { .. } => "LoadModel",
            Control::UnloadModel { .. } => "UnloadModel",
            Control::ModelUnloaded { .. } => "ModelUnloaded",
            Control::ListModels => "ListModels",
            Control::Models { .. } => "Models",
            Control::ClusterInfo => "ClusterInfo",
            Control::ClusterState { .. } => "ClusterState",
            Control::Generate { .. } => "Generate",
            Control::Tokens { .. } => "Tokens",
            Control::Generated(_) => "Generated",
            Control::EndSequence { .. } => "EndSequence",
            Control::Unreachable { .. } => "Unreachable",
            Control::Failed { .. } => "Failed",
        }
    }

    /// The frame's prefix and header for a payload of `payload_len` bytes
    /// (0 for messages without one).
    pub fn encode(&self, payload_len: u64, limits: &Limits) -> Result<Vec<u8>, WireError> {
        codec::encode_frame(FrameKind::Control, self, payload_len, limits)
    }

    /// The whole frame, payload included (for small payloads; large ones are
    /// written after [`Control::encode`] in chunks).
    pub fn encode_with(&self, payload: &Bytes, limits: &Limits) -> Result<Vec<u8>, WireError> {
        let mut out = self.encode(payload.len() as u64, limits)?;
        out.extend_from_slice(payload);
        Ok(out)
    }
}
