//! The model repository: networks known by a name. Named models come from
//! `[models.NAME]` tables of the configuration (loaded at start) or are
//! loaded by name through the SDK, the CLI (`tessera load NAME MODEL`) or
//! the KServe repository extension (`POST /v2/repository/models/NAME/load`).
//!
//! A named model the coordinator should serve is *wanted*: [`keep_loaded`]
//! loads every wanted model that has no network as soon as the workers its
//! devices and pins name are registered, and tries again when the set of
//! workers changes (or after [`RETRY_AFTER`]) when a load fails. Workers
//! it names that are still absent `worker_timeout_ms` after the
//! coordinator started are left out (as a re-plan after a loss leaves them
//! out); once they register, the model is planned again with them. A worker loss is healed by
//! [`crate::heal`] (the network outlives its deployments), so a request by
//! name is always served by the network's current deployment, and a
//! restarted coordinator loads its configured models again by itself.
//! Models loaded from bytes (SDK, CLI) live in the coordinator's memory.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tessera_common::affinity::{DeviceId, DevicePriority};
use tessera_common::graph::Graph;
use tessera_common::onnx::decode_model_shared;
use tessera_common::wire::control::{LoadRequest, ModelState, ModelStatus};
use tessera_common::wire::embed::EmbeddingSpec;
use tessera_common::wire::generate::GenerationSpec;
use tessera_common::wire::Progress;
use tokio::sync::mpsc;

use crate::config::{valid_model_name, ModelConfig};
use crate::network::{Current, Loaded, Origin};
use crate::{deploy, CoordinatorError, Shared};

mod keep;
pub use keep::keep_loaded;

/// A failed load is tried again after this long even if the workers did
/// not change.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// Where a named model's ONNX bytes come from.
#[derive(Clone)]
pub enum Source {
    /// A file, read at each load (a model replaced on disk is picked up by
    /// the next load).
    File(std::path::PathBuf),
    /// Bytes a client sent.
    Bytes(Sent),
}

/// Bytes a client sent, with their sha-256 once the state store needed it
/// (computed once however often the repository is saved; shared by
/// clones).
#[derive(Clone)]
pub struct Sent {
    pub bytes: Bytes,
    sha256: Arc<std::sync::OnceLock<String>>,
}

impl Sent {
    pub fn new(bytes: Bytes) -> Sent {
        Sent {
            bytes,
            sha256: Default::default(),
        }
    }

    /// Bytes whose sha-256 is known (kept ones).
    pub fn hashed(bytes: Bytes, sha256: String) -> Sent {
        Sent {
            bytes,
            sha256: Arc::new(sha256.into()),
        }
    }

    /// Their sha-256, hex (blocking the first time, for large bytes).
    pub fn sha256(&self) -> String {
        self.sha256
            .get_or_init(|| crate::state::sha256_hex(&self.bytes))
            .clone()
    }
}

/// One named model.
pub struct Entry {
    pub name: String,
    state: Mutex<EntryState>,
    /// One load or unload of this model at a time.
    busy: tokio::sync::Mutex<()>,
}

struct EntryState {
    source: Source,
    request: LoadRequest,
    wanted: bool,
    network: Option<u64>,
    loading: bool,
    /// Why the last load failed, the workers then and when.
    failure: Option<(String, Vec<String>, Instant)>,
    /// The model's graph (for metadata before it is loaded).
    graph: Option<Arc<Graph>>,
    /// Loaded without some workers its request names (absent then).
    degraded: bool,
}

/// The named models.
#[derive(Default)]
pub struct Repository {
    entries: dashmap::DashMap<String, Arc<Entry>>,
    /// Wakes [`keep_loaded`]: the workers changed, or a load ended.
    changed: tokio::sync::Notify,
}

impl Repository {
    /// The repository of `[models.NAME]` tables; every one wanted.
    pub fn from_config(models: &std::collections::BTreeMap<String, ModelConfig>) -> Repository {
        let repo = Repository::default();
        for (name, model) in models {
            let (source, request) = definition(name, model);
            repo.insert(name, source, request, true);
        }
        repo
    }

    fn insert(&self, name: &str, source: Source, request: LoadRequest, wanted: bool) -> Arc<Entry> {
        let entry = Arc::new(Entry {
            name: name.to_string(),
            state: Mutex::new(EntryState {
                source,
                request,
                wanted,
                network: None,
                loading: false,
                failure: None,
                graph: None,
                degraded: false,
            }),
            busy: tokio::sync::Mutex::new(()),
        });
        self.entries.insert(name.to_string(), entry.clone());
        entry
    }

    /// Something [`keep_loaded`] decides on changed: a worker came or went,
    /// or a load ended. (A wake-up while it is not waiting is kept for its
    /// next wait.)
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    pub fn get(&self, name: &str) -> Option<Arc<Entry>> {
        self.entries.get(name).map(|e| e.clone())
    }

    /// Names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.entries.iter().map(|e| e.key().clone()).collect();
        names.sort();
        names
    }

    /// Puts a kept entry back (a restarted coordinator's).
    pub fn restore(
        &self,
        name: &str,
        source: Source,
        request: LoadRequest,
        wanted: bool,
        network: Option<u64>,
    ) {
        let entry = self.insert(name, source, request, wanted);
        entry.attach_network(network);
    }

    /// The networks named models are served by.
    pub fn networks(&self) -> Vec<u64> {
        self.entries.iter().filter_map(|e| e.network()).collect()
    }

    /// Every entry as the state store keeps it: name, source, request,
    /// wanted, network.
    pub fn records(&self) -> Vec<(String, Source, LoadRequest, bool, Option<u64>)> {
        self.entries
            .iter()
            .map(|e| {
                let s = e.lock();
                let what = (s.source.clone(), s.request.clone(), s.wanted, s.network);
                (e.name.clone(), what.0, what.1, what.2, what.3)
            })
            .collect()
    }

    /// Forgets that `network` belongs to a named model (it was unloaded by
    /// its id): the model is no longer wanted.
    pub fn network_unloaded(&self, network: u64) {
        for e in self.entries.iter() {
            let mut s = e.lock();
            if s.network == Some(network) {
                s.network = None;
                s.wanted = false;
            }
        }
    }
}

impl Entry {
    fn lock(&self) -> std::sync::MutexGuard<'_, EntryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Network `network` serves it (a restored one), or none does.
    pub fn attach_network(&self, network: Option<u64>) {
        self.lock().network = network;
    }

    /// Network `network` serves it (a restored one).
    pub fn attach(&self, network: u64) {
        self.attach_network(Some(network));
    }

    /// The network serving it now, if loaded.
    pub fn network(&self) -> Option<u64> {
        self.lock().network
    }

    pub fn wanted(&self) -> bool {
        self.lock().wanted
    }

    /// Where its model comes from.
    pub fn source(&self) -> Source {
        self.lock().source.clone()
    }

    /// How it is loaded now.
    pub fn request(&self) -> LoadRequest {
        self.lock().request.clone()
    }
}

/// Where a `[models.NAME]` table's model comes from and how it is placed.
pub fn definition(name: &str, model: &ModelConfig) -> (Source, LoadRequest) {
    let request = model.load_request(name, tessera_gguf::generative::is_generative(&model.path));
    (Source::File(model.path.clone()), request)
}

/// The status of every named model, sorted by name.
pub fn statuses(shared: &Shared) -> Vec<ModelStatus> {
    shared
        .repository
        .names()
        .iter()
        .filter_map(|n| shared.repository.get(n))
        .map(|e| status(shared, &e))
        .collect()
}

/// One model's status: ready, loading, unavailable (with why) or
/// unloaded.
pub fn status(shared: &Shared, entry: &Entry) -> ModelStatus {
    let s = entry.lock();
    let absent = absent_workers(shared, &s.request);
    let (state, reason) = match s
        .network
        .and_then(|n| shared.networks.get(&n).map(|l| l.current()))
    {
        Some(Current::Ready(_)) => (ModelState::Ready, String::new()),
        Some(Current::Healing(_)) => (
            ModelState::Loading,
            "re-planning after a worker loss".into(),
        ),
        Some(Current::Broken(why)) => (ModelState::Unavailable, why),
        None if !s.wanted => (ModelState::Unloaded, String::new()),
        None if s.loading => (ModelState::Loading, String::new()),
        None if shared.workers.is_empty() => {
            (ModelState::Unavailable, "no worker is registered".into())
        }
        None if s.failure.is_none() && !absent.is_empty() => (
            ModelState::Unavailable,
            format!("waiting for workers {}", absent.join(", ")),
        ),
        None => (
            ModelState::Unavailable,
            s.failure.as_ref().map(|f| f.0.clone()).unwrap_or_default(),
        ),
    };
    ModelStatus {
        name: entry.name.clone(),
        state,
        network: s.network.unwrap_or(0),
        reason,
    }
}

/// The network that serves model `name` now.
pub fn serving(shared: &Shared, name: &str) -> Result<Arc<Loaded>, CoordinatorError> {
    let entry = shared
        .repository
        .get(name)
        .ok_or_else(|| CoordinatorError::UnknownModel(name.into()))?;
    let loaded = entry
        .network()
        .and_then(|n| shared.networks.get(&n).map(|l| l.clone()));
    match loaded {
        Some(l) => Ok(l),
        None => {
            let st = status(shared, &entry);
            let why = if st.reason.is_empty() {
                st.state.as_str().to_lowercase()
            } else {
                format!("{}: {}", st.state.as_str().to_lowercase(), st.reason)
            };
            Err(CoordinatorError::NotReady(format!(
                "model {name} is not loaded ({why})"
            )))
        }
    }
}

/// The graph of model `name` (its loaded network's, else read from its
/// source), for metadata.
pub async fn graph(shared: &Shared, name: &str) -> Result<Arc<Graph>, CoordinatorError> {
    let entry = shared
        .repository
        .get(name)
        .ok_or_else(|| CoordinatorError::UnknownModel(name.into()))?;
    let source = {
        let s = entry.lock();
        if let Some(g) = &s.graph {
            return Ok(g.clone());
        }
        s.source.clone()
    };
    let bytes = read(&source).await?;
    let graph = tokio::task::spawn_blocking(move || parse(bytes))
        .await
        .map_err(|e| CoordinatorError::Model(e.to_string()))??;
    let graph = Arc::new(graph);
    entry.lock().graph = Some(graph.clone());
    Ok(graph)
}

/// The graph of `bytes`, its weights slices of them (not copies).
fn parse(bytes: Bytes) -> Result<Graph, CoordinatorError> {
    let model = decode_model_shared(bytes).map_err(|e| CoordinatorError::Model(e.to_string()))?;
    Graph::from_model(model).map_err(|e| CoordinatorError::Model(e.to_string()))
}

pub(crate) async fn read(source: &Source) -> Result<Bytes, CoordinatorError> {
    read_with_spec(source, 1).await.map(|(bytes, _)| bytes)
}

/// A source's model bytes and, for a generative model read from its path
/// (a GGUF file or a model folder), what its files say of generation;
/// each copy to keep state for `max_sequences` sequences.
async fn read_with_spec(
    source: &Source,
    max_sequences: u32,
) -> Result<(Bytes, Option<GenerationSpec>), CoordinatorError> {
    let path = match source {
        Source::Bytes(sent) => return Ok((sent.bytes.clone(), None)),
        Source::File(path) => path.clone(),
    };
    tokio::task::spawn_blocking(move || {
        if tessera_gguf::generative::is_generative(&path) {
            let read = tessera_gguf::generative::read(&path, max_sequences)
                .map_err(|e| CoordinatorError::Model(e.to_string()))?;
            return Ok((read.model, Some(read.spec)));
        }
        std::fs::read(&path)
            .map(|b| (Bytes::from(b), None))
            .map_err(|e| CoordinatorError::Model(format!("cannot read {}: {e}", path.display())))
    })
    .await
    .map_err(|e| CoordinatorError::Model(e.to_string()))?
}

/// An embedding spec with its tokenizer, read from its path unless it
/// came with it.
async fn with_embedding_tokenizer(spec: EmbeddingSpec) -> Result<EmbeddingSpec, CoordinatorError> {
    if !spec.tokenizer_json.is_empty() {
        return Ok(spec);
    }
    let path = spec.tokenizer_path.clone();
    let read = tokio::task::spawn_blocking(move || std::fs::read_to_string(&path))
        .await
        .map_err(|e| CoordinatorError::Model(e.to_string()))?;
    let json = read.map_err(|e| {
        CoordinatorError::Model(format!(
            "cannot read the embedding tokenizer {}: {e}",
            spec.tokenizer_path
        ))
    })?;
    Ok(spec.with_tokenizer(json))
}

/// Loads model `name`, or answers with its network if it is loaded and
/// nothing new is given. With `new` (bytes and how to place them) the
/// model is (re)defined: the new network replaces the old one once it is
/// deployed, so requests by name never find it missing.
pub async fn load(
    shared: &Arc<Shared>,
    name: &str,
    new: Option<(Source, LoadRequest)>,
    progress: mpsc::Sender<Progress>,
) -> Result<Arc<Loaded>, CoordinatorError> {
    load_entry(shared, name, new, Keep::No, progress).await
}

/// What [`keep_loaded`] asks of a load.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Keep {
    /// An explicit load (SDK, CLI, HTTP): as requested, strictly.
    No,
    /// Only if still wanted (an unload meanwhile wins); `without_absent`:
    /// leaving out workers the request names that are not registered;
    /// `replace`: planned again even if loaded (a degraded load whose
    /// workers are all back).
    Yes { without_absent: bool, replace: bool },
}

async fn load_entry(
    shared: &Arc<Shared>,
    name: &str,
    new: Option<(Source, LoadRequest)>,
    keep: Keep,
    progress: mpsc::Sender<Progress>,
) -> Result<Arc<Loaded>, CoordinatorError> {
    if !valid_model_name(name) {
        return Err(CoordinatorError::Model(format!(
            "'{name}' is not a model name (1-128 of A-Z a-z 0-9 _ . -, not starting with '.')"
        )));
    }
    let entry = match (shared.repository.get(name), &new) {
        (Some(e), _) => e,
        (None, Some((source, request))) => {
            shared
                .repository
                .insert(name, source.clone(), request.clone(), false)
        }
        (None, None) => return Err(CoordinatorError::UnknownModel(name.into())),
    };
    let _busy = entry.busy.lock().await;
    let replacing = new.is_some() || matches!(keep, Keep::Yes { replace: true, .. });
    let without_absent = matches!(
        keep,
        Keep::Yes {
            without_absent: true,
            ..
        }
    );
    {
        let mut s = entry.lock();
        if let Some((source, mut request)) = new {
            request.name = name.to_string();
            request.dry_run = false;
            s.source = source;
            s.request = request;
            s.graph = None;
        }
        if keep != Keep::No && !s.wanted {
            return Err(CoordinatorError::NotReady(format!(
                "model {name} was unloaded"
            )));
        }
        s.wanted = true;
        if !replacing {
            if let Some(l) = s
                .network
                .and_then(|n| shared.networks.get(&n).map(|l| l.clone()))
            {
                return Ok(l);
            }
        }
        s.loading = true;
    }
    let result = load_now(shared, &entry, without_absent, progress).await;
    let old = {
        let mut s = entry.lock();
        s.loading = false;
        match &result {
            Ok(loaded) => {
                s.failure = None;
                s.degraded = without_absent;
                s.graph = Some(loaded.graph.clone());
                s.network.replace(loaded.id)
            }
            Err(e) => {
                s.failure = Some((e.to_string(), worker_names(shared), Instant::now()));
                None
            }
        }
    };
    shared.repository.changed();
    crate::state::save_models(shared).await;
    if let Some(old) = old {
        if let Err(e) = deploy::unload(shared, old).await {
            tracing::debug!(model = name, "replaced network {old}: {e}");
        }
    }
    result
}

async fn load_now(
    shared: &Arc<Shared>,
    entry: &Entry,
    without_absent: bool,
    progress: mpsc::Sender<Progress>,
) -> Result<Arc<Loaded>, CoordinatorError> {
    let (source, mut request) = {
        let s = entry.lock();
        (s.source.clone(), s.request.clone())
    };
    let max_sequences = request.generation.as_ref().map_or(1, |g| g.max_sequences);
    let (bytes, spec) = read_with_spec(&source, max_sequences).await?;
    if let (Some(spec), Some(wanted)) = (spec, &request.generation) {
        if wanted.tokenizer_json.is_empty() {
            request.generation = Some(spec.limited_by(wanted));
        }
    }
    if let Some(embedding) = request.embedding.take() {
        request.embedding = Some(with_embedding_tokenizer(embedding).await?);
    }
    let absent = absent_workers(shared, &request);
    if without_absent && !absent.is_empty() {
        tracing::warn!(
            model = %entry.name,
            "loading without workers {} (named by its devices or pins, not registered)",
            absent.join(", ")
        );
        request = crate::heal::without_lost(shared, &request)?;
    }
    tracing::info!(model = %entry.name, "loading named model");
    let origin = match source {
        Source::File(path) => Origin::File(path),
        Source::Bytes(_) => Origin::Sent,
    };
    deploy::load_network(shared, request, (bytes, origin), progress).await
}

/// Unloads model `name`: it stays in the repository, not wanted, until it
/// is loaded again.
pub async fn unload(shared: &Arc<Shared>, name: &str) -> Result<(), CoordinatorError> {
    let entry = shared
        .repository
        .get(name)
        .ok_or_else(|| CoordinatorError::UnknownModel(name.into()))?;
    let _busy = entry.busy.lock().await;
    let network = {
        let mut s = entry.lock();
        s.wanted = false;
        s.failure = None;
        s.network.take()
    };
    if let Some(network) = network {
        deploy::unload(shared, network).await?;
    } else {
        crate::state::save_models(shared).await;
    }
    tracing::info!(model = name, "named model unloaded");
    Ok(())
}

/// Workers that `request`'s devices or manual pins name and that are not
/// registered now.
fn absent_workers(shared: &Shared, request: &LoadRequest) -> Vec<String> {
    let mut named: Vec<String> = Vec::new();
    if let Ok(priority) = DevicePriority::parse(&request.devices) {
        named.extend(priority.devices.iter().filter_map(|d| d.host.clone()));
    }
    for (_, device) in &request.affinity {
        if let Ok(d) = DeviceId::parse(device) {
            named.extend(d.host);
        }
    }
    named.sort();
    named.dedup();
    named.retain(|h| !shared.workers.contains_key(h));
    named
}

fn worker_names(shared: &Shared) -> Vec<String> {
    let mut names: Vec<String> = shared.workers.iter().map(|w| w.key().clone()).collect();
    names.sort();
    names
}

/// A progress channel whose reports go to the debug log (loads nobody
/// watches: at start, over HTTP).
pub fn progress_log(model: &str) -> mpsc::Sender<Progress> {
    let (tx, mut rx) = mpsc::channel(64);
    let model = model.to_string();
    tokio::spawn(async move {
        while let Some(Progress { what, done, total }) = rx.recv().await {
            tracing::debug!(%model, "[{done}/{total}] {what}");
        }
    });
    tx
}
