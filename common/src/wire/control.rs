//! The records control messages carry (devices, deployment specs, load
//! requests, counters, model states, error kinds). The messages themselves
//! are per channel: [`super::client`], [`super::cluster`], [`super::peer`].

use serde::{Deserialize, Serialize};

use super::embed::EmbeddingSpec;
use super::generate::GenerationSpec;
use crate::affinity::Policy;
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
    /// A final output: back to the request's requester, on the stream it
    /// opened for the request.
    Requester,
}

/// A subgraph output and its consumers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub tensor: String,
    pub to: Vec<Destination>,
}

/// A subgraph to compile and serve. Its model follows on the same stream
/// only if the worker asks for it ([`super::cluster::WorkerAnswer::NeedModel`]): a worker whose
/// compile cache holds the hash compiles nothing and receives nothing, and
/// one that holds some of its weights ([`Self::pieces`]) is sent the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploySpec {
    pub network: u64,
    pub subgraph: u32,
    pub device: String,
    /// SHA-256 of the model's content, hex (see
    /// [`super::pieces::layout`]): the worker's compile-cache key.
    pub model_hash: String,
    /// The model's size in bytes.
    pub model_bytes: u64,
    /// The pieces the model is sent in, each large weight by its hash.
    pub pieces: Vec<super::pieces::PieceRef>,
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
    /// Fresh sequences that may wait for room (beyond: refused as busy).
    pub max_queued: u32,
    /// How long a fresh sequence may wait for room, ms.
    pub queue_timeout_ms: u64,
    /// The file or folder the model was read from: a named model's path
    /// in the model repository, or the path its client loaded it from. A
    /// worker that may read models there (`--models-dir`), or holds a
    /// copy of that name, takes the weights it lacks from its own disk,
    /// each checked by its SHA-256.
    pub source: Option<String>,
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
/// Its default: every device by priority, one copy, no batching.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// An embedding network: its tokenizer and pooling (absent: requests
    /// only).
    pub embedding: Option<EmbeddingSpec>,
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
    /// Of `memory_in_use`, what its stages keep for sequences' state (KV
    /// caches), per device kind, bytes.
    pub state_in_use: Vec<(String, u64)>,
    /// The worker process's resident memory at its last heartbeat, bytes
    /// (0: not reported).
    pub rss_bytes: u64,
    /// Its compiles and compile-cache loads since it started.
    pub compiles: CompileCounts,
    pub phase: WorkerPhase,
}

/// Where a registered worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerPhase {
    /// Registered, no heartbeat yet.
    Joining,
    /// Heartbeating: plans may use it.
    Ready,
    /// Leaving (SIGTERM): nothing new is planned on it.
    Draining,
}

impl WorkerPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerPhase::Joining => "joining",
            WorkerPhase::Ready => "ready",
            WorkerPhase::Draining => "draining",
        }
    }
}

/// A worker's compiles since it started: subgraphs compiled from a model,
/// and subgraphs loaded from its compile cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompileCounts {
    pub compiled: u64,
    pub cache_loads: u64,
}

/// One coordinator of the cluster (HA: the leader and its standbys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorInfo {
    /// The address workers and clients dial.
    pub addr: String,
    /// The leader's epoch; a standby's place in line (its candidacy's
    /// revision: the next leader is the standby with the lowest).
    pub epoch: u64,
    pub leading: bool,
}

/// A subgraph a worker serves: what a coordinator needs to adopt it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HeldSubgraph {
    pub deployment: u64,
    pub subgraph: u32,
    /// The sha-256 of the subgraph's model, as its `DeploySpec` said.
    pub model_hash: String,
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

/// One subgraph actor's load: a heartbeat's gauge and counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubgraphLoad {
    /// The deployment (network id on the wire to workers).
    pub network: u64,
    pub subgraph: u32,
    /// Requests it holds now (waiting for inputs, ready, computing).
    pub depth: u32,
    /// Runs since it was deployed (a counter).
    pub runs: u64,
    /// Its compute time since it was deployed, µs (a counter).
    pub busy_us: u64,
    /// Runs that failed (a counter).
    pub failed: u64,
}

/// One stateful deployment's sequences on a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceLoad {
    pub network: u64,
    /// Sequences whose state it keeps.
    pub kept: u32,
    /// Fresh sequences waiting for room.
    pub waiting: u32,
}

/// Tensors received from one peer since the worker started (counters):
/// the link's measured speed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkRate {
    pub peer: String,
    pub tensors: u64,
    pub bytes: u64,
    /// Time from each tensor's first byte to its last, summed.
    pub micros: u64,
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

/// What kind of failure a [`super::message::Failure`] reports: what a caller can
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
    /// Too busy now: every copy's sequences and queue are full, or a
    /// worker's mailboxes are (HTTP 429, gRPC RESOURCE_EXHAUSTED).
    Busy,
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
            ErrorKind::Busy => "busy",
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
