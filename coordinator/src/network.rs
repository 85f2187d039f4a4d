//! A loaded network, its copies (replicas) and their deployments: what
//! serves each copy now (ready, healing, broken) and where each subgraph
//! of a deployment runs (what its routing table publishes,
//! [`crate::routes`]). The state the healing path, the repository and the
//! routing tables share; the code that changes it lives in
//! [`crate::deploy`] and [`crate::heal`].

use std::sync::Arc;

use bytes::Bytes;
use tessera_common::dump::{PlanReport, ReplicaReport};
use tessera_common::graph::Graph;
use tessera_common::onnx::bones::Bones;
use tessera_common::schedule::Considered;
use tessera_common::wire::control::LoadRequest;
use tokio::sync::watch;

/// Where one subgraph runs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    pub host: String,
    pub device: String,
    pub nodes: usize,
}

/// One deployment of one copy of a loaded network (a copy that lost a
/// worker gets a new one, see [`crate::heal`]).
pub struct Deployed {
    /// The deployment's id: the network id on the wire to workers.
    pub id: u64,
    /// The network's id, as clients know it.
    pub network: u64,
    pub name: String,
    /// The graph, shared with the loaded network (never a copy).
    pub graph: Arc<Graph>,
    pub outputs: Vec<String>,
    /// Outputs that are state (a step of a sequence keeps them on its
    /// stage; they never come back).
    pub state_outputs: Vec<String>,
    /// Graph input → workers that read it.
    pub input_routes: Vec<(String, Vec<String>)>,
    /// Graph output → the worker that makes it.
    pub output_makers: Vec<(String, String)>,
    /// Each worker's data address (what requesters dial).
    pub addrs: Vec<(String, String)>,
    /// Workers with subgraphs that have no inputs (sent a trigger per
    /// request).
    pub trigger_hosts: Vec<String>,
    /// Workers with subgraphs that read only state: a later step of a
    /// sequence brings them nothing, so they are sent its trigger.
    pub state_trigger_hosts: Vec<String>,
    /// Every worker it runs on.
    pub hosts: Vec<String>,
    pub placements: Vec<Placement>,
    /// The copy's plan (subgraphs, affinity, explanations, hosts).
    pub plan: PlanReport,
    /// Predicted time of one request from inputs to outputs, µs.
    pub predicted_latency_us: f64,
    /// Predicted requests per second when pipelined.
    pub predicted_rps: f64,
    /// Each subgraph's worker and model hash: what a worker must hold for
    /// a coordinator to adopt this deployment.
    pub models: Vec<SubgraphModel>,
}

/// One subgraph of a deployment: its worker, index and model hash.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SubgraphModel {
    pub host: String,
    pub subgraph: u32,
    pub model_hash: String,
}

impl Deployed {
    fn replica_report(&self) -> ReplicaReport {
        ReplicaReport {
            deployment: self.id,
            hosts: self.hosts.clone(),
            devices: self
                .plan
                .subgraphs
                .iter()
                .map(|s| s.device.clone())
                .collect(),
            predicted_latency_us: self.predicted_latency_us.round(),
            predicted_rps: self.predicted_rps,
            measured: Vec::new(),
        }
    }
}

/// What serves a copy now.
#[derive(Clone)]
pub enum Current {
    Ready(Arc<Deployed>),
    /// Being re-planned; the deployment it had, if any.
    Healing(Option<Arc<Deployed>>),
    /// No worker set that remains can run it.
    Broken(String),
}

/// One copy of a loaded network.
pub struct Replica {
    /// 1-based, as errors and logs name it.
    pub index: usize,
    /// The workers this copy may use when it is re-planned (`None`: any
    /// connected worker; a network with one copy).
    pub hosts: Option<Vec<String>>,
    pub(crate) current: watch::Sender<Current>,
    /// One re-plan at a time.
    pub(crate) healing: tokio::sync::Mutex<()>,
    /// Where its nodes ran last (node → `host/DEVICE`), kept through a
    /// loss: a re-plan keeps a pipelined placement that still fits.
    placement: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
    /// Its earlier deployments that still finish what they hold (it moved
    /// off a draining worker), until they are undeployed.
    pub(crate) retiring: std::sync::Mutex<Vec<u64>>,
}

impl Replica {
    pub fn new(index: usize, hosts: Option<Vec<String>>, deployed: Arc<Deployed>) -> Replica {
        let placement = deployed.plan.affinity.clone();
        Replica {
            index,
            hosts,
            current: watch::Sender::new(Current::Ready(deployed)),
            healing: tokio::sync::Mutex::new(()),
            placement: std::sync::Mutex::new(placement),
            retiring: Default::default(),
        }
    }

    /// A kept copy, as a restarted coordinator restores it.
    pub fn restored(
        index: usize,
        hosts: Option<Vec<String>>,
        current: Current,
        placement: std::collections::BTreeMap<String, String>,
    ) -> Replica {
        Replica {
            index,
            hosts,
            current: watch::Sender::new(current),
            healing: tokio::sync::Mutex::new(()),
            placement: std::sync::Mutex::new(placement),
            retiring: Default::default(),
        }
    }

    /// Its deployments that still finish what they hold.
    pub fn retiring(&self) -> Vec<u64> {
        self.retiring.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// `old` finishes what it holds (`true`) or is gone (`false`).
    pub(crate) fn set_retiring(&self, old: u64, retiring: bool) {
        if let Ok(mut r) = self.retiring.lock() {
            r.retain(|&id| id != old);
            if retiring {
                r.push(old);
            }
        }
    }

    pub fn current(&self) -> Current {
        self.current.borrow().clone()
    }

    /// The deployment on the workers now (also while healing), if any.
    pub fn deployed(&self) -> Option<Arc<Deployed>> {
        match &*self.current.borrow() {
            Current::Ready(d) | Current::Healing(Some(d)) => Some(d.clone()),
            _ => None,
        }
    }

    /// Where its nodes ran last (node → `host/DEVICE`).
    pub fn placement(&self) -> std::collections::BTreeMap<String, String> {
        self.placement.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Remembers where `deployed` runs its nodes.
    pub fn placed(&self, deployed: &Deployed) {
        if let Ok(mut p) = self.placement.lock() {
            p.clone_from(&deployed.plan.affinity);
        }
    }
}

/// The most frame bytes a network's bones are kept with: its record is an
/// etcd value (chunked; etcd takes values up to 1.5 MiB and keeps every
/// revision until it compacts). SmolLM2-135M's bones are 0.5 MB and
/// MiniLM-L3's 0.16 MB; PP-OCRv4 rec, all weights under 64 KiB, would be
/// its whole 10.9 MB, and is kept without them.
pub const MAX_BONES: usize = 4 << 20;

/// A network a client loaded: what it asked for (to plan it again) and its
/// copies.
pub struct Loaded {
    /// The id clients use.
    pub id: u64,
    pub name: String,
    pub graph: Arc<Graph>,
    /// What the client asked (planned again when healing).
    pub(crate) request: LoadRequest,
    /// Its model's bytes (see [`Loaded::model`]).
    pub(crate) held: std::sync::Mutex<HeldModel>,
    /// Its model's bones, once the state store needed them (or as kept).
    pub(crate) bones: std::sync::OnceLock<Option<Arc<Bones>>>,
    /// Held while its model is taken back from the workers.
    pub(crate) completing: tokio::sync::Mutex<()>,
    pub replicas: Vec<Arc<Replica>>,
    /// `replicas = auto`: what the scheduler weighed.
    pub considered: Vec<Considered>,
    /// A generative network's tokenizer, template and limits.
    pub generator: Option<Arc<crate::generative::Generative>>,
    /// An embedding network's tokenizer and pooling.
    pub embedder: Option<Arc<tessera_common::wire::embed::EmbeddingSpec>>,
    /// Its routing table as last published ([`crate::routes::publish`]).
    pub(crate) published: std::sync::Mutex<Option<Arc<tessera_common::wire::routes::RoutingTable>>>,
    /// The tensors' types the workers reported when it was planned (its
    /// graph is rebuilt from them after a restart).
    pub(crate) types: std::collections::BTreeMap<String, tessera_common::plan::ReportedType>,
    /// Where its model came from: the file a named model reads (kept by
    /// path), else bytes a client sent (kept in the state store).
    pub(crate) origin: Origin,
    /// The sha-256 of `model`, once computed (the state store's key).
    pub(crate) model_sha: std::sync::OnceLock<String>,
}

/// A network's model as the coordinator holds it.
pub(crate) struct HeldModel {
    bytes: Bytes,
    /// Restored without its bytes: `bytes` is these bones' placeholder
    /// (zeros for weights), which nothing must compile.
    lacking: Option<Arc<Bones>>,
}

/// Where a loaded network's model came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// Bytes a client sent.
    Sent,
    /// A named model's file or folder.
    File(std::path::PathBuf),
}

impl Origin {
    /// Where the model was read from, as a deploy names it to workers that
    /// may read it from their own disk: a named model's file or folder,
    /// else the path a client loaded it from (its request's name; the
    /// CLI names a model by its path).
    pub(crate) fn source(&self, request: &LoadRequest) -> Option<String> {
        match self {
            Origin::File(path) => Some(path.display().to_string()),
            Origin::Sent => Some(request.name.clone()).filter(|n| !n.is_empty()),
        }
    }
}

/// What a loaded network is made of.
pub struct Parts {
    pub id: u64,
    pub request: LoadRequest,
    pub model: Bytes,
    /// Set when `model` is these bones' placeholder (restored without the
    /// model's bytes).
    pub lacking: Option<Arc<Bones>>,
    pub origin: Origin,
    pub graph: Arc<Graph>,
    pub types: std::collections::BTreeMap<String, tessera_common::plan::ReportedType>,
    pub replicas: Vec<Arc<Replica>>,
    pub considered: Vec<Considered>,
    pub generator: Option<Arc<crate::generative::Generative>>,
    pub embedder: Option<Arc<tessera_common::wire::embed::EmbeddingSpec>>,
}

impl Loaded {
    /// Where its model was read from ([`Origin::source`]).
    pub(crate) fn source(&self) -> Option<String> {
        self.origin.source(&self.request)
    }

    pub fn new(parts: Parts) -> Loaded {
        Loaded {
            id: parts.id,
            name: parts.request.name.clone(),
            graph: parts.graph,
            request: parts.request,
            bones: match &parts.lacking {
                Some(b) => std::sync::OnceLock::from(Some(b.clone())),
                None => std::sync::OnceLock::new(),
            },
            held: std::sync::Mutex::new(HeldModel {
                bytes: parts.model,
                lacking: parts.lacking,
            }),
            completing: Default::default(),
            replicas: parts.replicas,
            considered: parts.considered,
            generator: parts.generator,
            embedder: parts.embedder,
            published: std::sync::Mutex::new(None),
            types: parts.types,
            origin: parts.origin,
            model_sha: std::sync::OnceLock::new(),
        }
    }

    /// The sha-256 of its model, hex (computed once; blocking for a large
    /// model).
    pub fn model_sha(&self) -> String {
        self.model_sha
            .get_or_init(|| crate::state::sha256_hex(&self.held().bytes))
            .clone()
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HeldModel> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its model's bytes; `None` while it lacks them (restored from its
    /// bones: see [`crate::state::lacking`]).
    pub(crate) fn model(&self) -> Option<Bytes> {
        let held = self.held();
        held.lacking.is_none().then(|| held.bytes.clone())
    }

    /// The bones of a model it lacks.
    pub(crate) fn lacking(&self) -> Option<Arc<Bones>> {
        self.held().lacking.clone()
    }

    /// Its model's bytes, taken back: it lacks nothing any more.
    pub(crate) fn complete(&self, bytes: Bytes) {
        let mut held = self.held();
        held.bytes = bytes;
        held.lacking = None;
    }

    /// Its model's bones (blocking: hashes its large weights the first
    /// time); `None` when they would be too large to keep as a record
    /// ([`MAX_BONES`]) or the model cannot be decoded.
    pub(crate) fn bones(&self) -> Option<Arc<Bones>> {
        self.bones
            .get_or_init(|| {
                let model = self.model()?;
                let proto = tessera_common::onnx::decode_model_shared(model.clone()).ok()?;
                let bones = Bones::of(&model, &proto, |w| tessera_gguf::pages::release(w));
                (bones.frames.len() <= MAX_BONES).then(|| Arc::new(bones))
            })
            .clone()
    }

    /// Every deployment on the workers now.
    pub fn deployments(&self) -> Vec<Arc<Deployed>> {
        self.replicas.iter().filter_map(|r| r.deployed()).collect()
    }

    /// Whether deployment `id` serves one of its copies.
    pub fn serves(&self, id: u64) -> bool {
        self.replicas
            .iter()
            .any(|r| r.deployed().is_some_and(|d| d.id == id))
    }

    /// What serves the network as a whole: ready while any copy is, broken
    /// when every copy is, healing otherwise.
    pub fn current(&self) -> Current {
        let states: Vec<Current> = self.replicas.iter().map(|r| r.current()).collect();
        if let Some(ready) = states.iter().find(|c| matches!(c, Current::Ready(_))) {
            return ready.clone();
        }
        if let Some(healing) = states.iter().find(|c| matches!(c, Current::Healing(_))) {
            return healing.clone();
        }
        let why: Vec<String> = states
            .into_iter()
            .filter_map(|c| match c {
                Current::Broken(e) => Some(e),
                _ => None,
            })
            .collect();
        Current::Broken(why.join("; "))
    }

    /// The plan clients see: the first copy's, with every copy listed
    /// when there are several.
    pub fn plan(&self) -> PlanReport {
        let deployed = self.deployments();
        let mut report = deployed.first().map(|d| d.plan.clone()).unwrap_or_default();
        report.predicted_rps = deployed.iter().map(|d| d.predicted_rps).sum();
        if self.replicas.len() > 1 {
            report.replicas = deployed.iter().map(|d| d.replica_report()).collect();
        }
        report.considered = self.considered.clone();
        report.network = self.id;
        report
    }
}
