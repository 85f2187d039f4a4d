//! The worker daemon: serves this machine's device plugins to a cluster.
//!
//! It dials the coordinator (mutual TLS), registers its devices with their
//! metrics and sends heartbeats on the connection's control stream, with
//! what its deployments did (aggregated). The coordinator opens one
//! bidirectional stream per operation (QueryNetwork, Deploy, Undeploy).
//! Requests never come from the coordinator: requesters (the SDK, front
//! doors) dial the worker's data address and open a stream per request
//! (`data`), other workers stream intermediate tensors to it; tensors are
//! dispatched to one actix actor per deployed subgraph ([`actor`]), and
//! outputs stream to their consumers ([`routes`]): graph outputs back to
//! the requester ([`requesters`]). Compiled subgraphs are cached on disk by
//! model hash, and large weights by their SHA-256 ([`cache`]).
//!
//! Layout: this file (options, devices, the reconnecting loop), `session`
//! (one registration and what it serves), `operations` (the coordinator's
//! operations: QueryNetwork, Deploy, ...), `data` (the data channel),
//! [`requesters`], [`actor`], `admission` (fresh sequences waiting for
//! room), [`routes`] (the router and its rooms: [`deployments`], what is
//! deployed here; [`telemetry`], what it did, for the heartbeats;
//! `sequence_stores`, each network's kept sequences; [`peers`], the links
//! to other workers), [`cache`], [`config`] (the worker's TOML file),
//! `leader` (following the leading coordinator of several, and fencing).
//!
//! [`run`] must be called inside an actix system on a tokio multi-thread
//! runtime (`actix_rt::System::with_tokio_rt`).

pub mod actor;
mod admission;
mod batch;
pub mod cache;
pub mod config;
mod data;
pub mod deployments;
mod leader;
pub mod local_models;
mod operations;
pub mod peers;
pub mod requesters;
pub mod routes;
mod sequence_stores;
mod sequences;
mod session;
mod state_rows;
pub mod telemetry;
mod weights;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_common::backoff::Backoff;
use tessera_common::wire::control::DeviceInfo;
use tessera_common::wire::handshake::Role;
use tessera_net::{NetError, Node};

use crate::plugin::{Config, DevicePlugin, MetricValue, PluginError};
use crate::plugins;
// The daemon's callers (the worker program) read the memory here too.
pub use crate::memory::available_memory;
use actor::stop_all;
use cache::{CompileCache, WeightStore};
use routes::Router;
use session::session;

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub name: String,
    /// Device kinds to serve (`CPU`, `GPU`).
    pub devices: Vec<String>,
    /// Address to accept worker-to-worker streams on.
    pub listen: SocketAddr,
    /// Address other workers dial, `host:port` (default: the bound
    /// address, with the address the coordinator is reached from when
    /// bound to all interfaces).
    pub advertise: Option<String>,
    /// The coordinator, `host:port`; with HA, every coordinator,
    /// comma-separated (`a:7400,b:7400`): the worker follows the leader.
    pub coordinator: String,
    /// Dial the coordinator again (with back-off) when it goes away or
    /// cannot be reached, instead of returning.
    pub reconnect: bool,
    pub cluster: String,
    /// Bounded mailbox of each subgraph actor.
    pub mailbox: usize,
    /// Where compiled subgraphs and weights are cached (none: no cache).
    pub cache_dir: Option<PathBuf>,
    /// The most bytes each of the two caches keeps (compiled subgraphs;
    /// weights), the least recently used going first.
    pub cache_limit: u64,
    /// Directories this worker may read models from: a deploy whose model
    /// was read from a path under one of them, or from a file or folder of
    /// the same name as one in them, takes its weights there
    /// ([`local_models`]) instead of receiving them.
    pub models_dirs: Vec<PathBuf>,
    /// Plugin configuration (e.g. `NUM_THREADS`) for every compile.
    pub config: Vec<(String, String)>,
    /// The most memory each device offers for models (none: what it has).
    pub memory_limit: config::MemoryLimits,
    /// How long what is deployed here keeps serving after the coordinator
    /// is lost, waiting for one (it restarted, or a standby took over) to
    /// adopt it; then it is unloaded.
    pub adopt_grace: Duration,
    /// When stopped (SIGTERM) with deployments here, the longest it keeps
    /// serving while the coordinator moves them elsewhere (zero: it stops
    /// at once, and their requests are retried by their requesters).
    pub drain_timeout: Duration,
}

/// The default of [`WorkerOptions::adopt_grace`].
pub const ADOPT_GRACE: Duration = Duration::from_secs(300);

/// The default of [`WorkerOptions::drain_timeout`]: within Kubernetes'
/// default grace period of 30 s (less a preStop pause).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a worker stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("device {device}: {source}\n  devices this machine has: {available}")]
    Device {
        device: String,
        available: String,
        #[source]
        source: PluginError,
    },
    #[error("no devices to serve")]
    NoDevices,
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("the coordinator refused registration: {0}")]
    Registration(String),
    #[error("lost the coordinator: {0}")]
    CoordinatorLost(String),
    /// No listed coordinator leads now (HA: a standby is taking over).
    #[error("no coordinator leads: {0}")]
    NoLeader(String),
    /// A newer leader took over (HA): register with it at once.
    #[error("{0}")]
    NewLeader(String),
    #[error(transparent)]
    Plugin(#[from] PluginError),
}

/// The device kinds this build can serve here, with why not for the rest.
pub fn available_devices() -> String {
    plugins::BACKENDS
        .iter()
        .map(|(kind, _)| match plugins::create(kind) {
            Ok(_) => kind.to_string(),
            Err(e) => format!("{kind} (not available: {e})"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl WorkerError {
    /// Whether dialling the coordinator again may help: it went away or
    /// could not be reached, as opposed to a refusal (a certificate from
    /// another CA, another protocol version or cluster) or a local error.
    fn transient(&self) -> bool {
        matches!(
            self,
            WorkerError::CoordinatorLost(_)
                | WorkerError::NoLeader(_)
                | WorkerError::NewLeader(_)
                | WorkerError::Net(
                    NetError::Stream(_) | NetError::Resolve { .. } | NetError::Connect { .. },
                )
        )
    }
}

/// One served device.
#[derive(Clone)]
struct Device {
    kind: String,
    plugin: Arc<dyn DevicePlugin>,
}

/// Creates the plugins for `kinds`; unknown or unavailable devices are an
/// error that lists what this machine has.
fn open_devices(kinds: &[String], config: &[(String, String)]) -> Result<Vec<Device>, WorkerError> {
    if kinds.is_empty() {
        return Err(WorkerError::NoDevices);
    }
    let mut devices = Vec::new();
    for kind in kinds {
        let plugin = plugins::create(kind).map_err(|source| WorkerError::Device {
            device: kind.clone(),
            available: available_devices(),
            source,
        })?;
        for (k, v) in config {
            plugin.set_config(k, v)?;
        }
        devices.push(Device {
            kind: kind.clone(),
            plugin,
        });
    }
    Ok(devices)
}

fn device_info(d: &Device, limits: &config::MemoryLimits) -> DeviceInfo {
    let number = |name: &str| match d.plugin.metric(name) {
        Ok(MetricValue::Number(x)) => x,
        _ => 0.0,
    };
    DeviceInfo {
        device: d.kind.clone(),
        full_name: d
            .plugin
            .metric("FULL_DEVICE_NAME")
            .map(|m| m.to_string())
            .unwrap_or_default(),
        gflops: number("GFLOPS"),
        bandwidth_gbps: number("MEMORY_BANDWIDTH_GBPS"),
        memory_bytes: memory_bytes(d, limits),
        metrics: Vec::new(),
    }
}

/// The memory a device offers for models, as the coordinator plans
/// against it: the worker's limit for its kind where one is set, else
/// what the device reports (see the `MEMORY_BYTES` metric: a CPU device
/// the machine's available memory, a GPU its adapter's), less the CPU's
/// reserve; 0 when neither is known (not limited).
fn memory_bytes(d: &Device, limits: &config::MemoryLimits) -> u64 {
    let reported = match d.plugin.metric("MEMORY_BYTES") {
        Ok(MetricValue::Number(n)) if n > 0.0 => Some(n as u64),
        _ => None,
    };
    limits.offered(&d.kind, reported).unwrap_or(0)
}

/// The compile cache and the weight store in `options.cache_dir`
/// (`compiled/`, `weights/`), indexed off the async threads.
async fn open_caches(
    options: &WorkerOptions,
) -> (Option<Arc<CompileCache>>, Option<Arc<WeightStore>>) {
    let Some(dir) = options.cache_dir.clone() else {
        return (None, None);
    };
    let limit = options.cache_limit;
    let opened = tokio::task::spawn_blocking(move || {
        (
            Arc::new(CompileCache::open(dir.join("compiled"), limit)),
            Arc::new(WeightStore::open(dir.join("weights"), limit)),
        )
    })
    .await;
    match opened {
        Ok((cache, weights)) => (Some(cache), Some(weights)),
        Err(e) => {
            tracing::warn!("opening the caches: {e}; running without");
            (None, None)
        }
    }
}

/// Drops the weights of a model read from this disk once no deploy has
/// used them for [`local_models::KEEP_IDLE`].
async fn forget_idle_models(state: Arc<State>) {
    let Some(local) = state.local_models.clone() else {
        return;
    };
    loop {
        tokio::time::sleep(local_models::KEEP_IDLE / 3).await;
        let local = local.clone();
        // Dropping a model's weights frees its memory: off the async threads.
        let _ = tokio::task::spawn_blocking(move || local.forget_idle(Instant::now())).await;
    }
}

struct State {
    name: String,
    devices: Vec<Device>,
    router: Arc<Router>,
    cache: Option<Arc<CompileCache>>,
    /// Large weights by content, in the cache directory.
    weights: Option<Arc<WeightStore>>,
    /// Models on this worker's disk it may read weights from.
    local_models: Option<Arc<local_models::LocalModels>>,
    mailbox: usize,
    config: Config,
    node: Arc<Node>,
    /// The actix system's arbiter: actors start there (not from tokio tasks).
    arbiter: actix::ArbiterHandle,
    /// Since when no coordinator has adopted what is deployed here (none:
    /// the coordinator of the session now did).
    orphaned: std::sync::Mutex<Option<Instant>>,
    /// The registration now (one more at each): a Deploy of an earlier
    /// one that ends after it is not started.
    session: std::sync::atomic::AtomicU64,
    /// The coordinators, who leads, and the newest epoch (fencing).
    leaders: leader::Leaders,
}

/// The waits between two tries to reach the coordinator: from 100 ms to
/// at most 1 s (a standby taking over is found within a second), started
/// over after a session that lasted 10 s.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1))
    .healthy_after(Duration::from_secs(10));

/// Runs the worker: registers with the coordinator and serves it until it
/// goes away; then, with `options.reconnect`, dials it again (a restarted
/// coordinator gets its workers back by itself), otherwise returns.
/// `ready` is called at the first registration, with the worker's data
/// address.
pub async fn run(
    options: WorkerOptions,
    identity: &tessera_net::certs::NodeIdentity,
    ready: impl FnOnce(&str),
) -> Result<(), WorkerError> {
    run_until(options, identity, ready, std::future::pending()).await
}

/// [`run`] until `stop` completes (SIGTERM, Ctrl-C): then every connection
/// is closed at once with [`tessera_net::CloseCode::Shutdown`], so the
/// coordinator re-plans this worker's networks and retries its requests
/// elsewhere without waiting for a heartbeat timeout.
pub async fn run_until(
    options: WorkerOptions,
    identity: &tessera_net::certs::NodeIdentity,
    ready: impl FnOnce(&str),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), WorkerError> {
    // Plugin start-up (a GPU adapter, device and shaders) and the metrics'
    // calibration block: off the async threads, so that the QUIC endpoints
    // and heartbeats of this process (an embedded cluster runs several
    // workers on one runtime) keep flowing.
    let (kinds, config) = (options.devices.clone(), options.config.clone());
    let limits = options.memory_limit.clone();
    let (devices, infos) = tokio::task::spawn_blocking(move || {
        let devices = open_devices(&kinds, &config)?;
        let infos: Vec<DeviceInfo> = devices.iter().map(|d| device_info(d, &limits)).collect();
        Ok::<_, WorkerError>((devices, infos))
    })
    .await
    .map_err(|e| {
        WorkerError::Plugin(PluginError::Unavailable {
            plugin: options.devices.join(","),
            reason: format!("device start-up failed: {e}"),
        })
    })??;
    // One endpoint for every session: its port stays this worker's.
    let node = Arc::new(Node::bind(
        options.listen,
        identity,
        &options.cluster,
        Role::Worker,
    )?);
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    let serving = serve_sessions(&options, &node, devices, &infos, ready, stopped);
    tokio::pin!(serving);
    let outcome = tokio::select! {
        outcome = &mut serving => outcome,
        () = stop => {
            tracing::info!("shutting down: stopping the subgraphs, closing every connection");
            let _ = stopping.send(true);
            serving.await
        }
    };
    node.shutdown().await;
    outcome
}

/// Sessions with the coordinator, one after another while it can be
/// reached again, until `stopped` turns true. What is deployed here, and
/// the connections of requesters and other workers, outlive each session;
/// they end in order when this returns: the subgraphs stopped (their
/// compute threads joined), the links closed; the devices are dropped
/// after.
async fn serve_sessions(
    options: &WorkerOptions,
    node: &Arc<Node>,
    devices: Vec<Device>,
    infos: &[DeviceInfo],
    ready: impl FnOnce(&str),
    stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    let mut config = Config::default();
    for (k, v) in &options.config {
        config.set(k, v)?;
    }
    let (cache, weights) = open_caches(options).await;
    // Resolving the directories reads the file system: off the async threads.
    let dirs = options.models_dirs.clone();
    let local_models = tokio::task::spawn_blocking(move || local_models::LocalModels::new(&dirs))
        .await
        .ok()
        .flatten()
        .map(Arc::new);
    let state = Arc::new(State {
        name: options.name.clone(),
        devices,
        router: Arc::new(Router::new(&options.name, node.clone())),
        cache,
        weights,
        local_models,
        mailbox: options.mailbox.max(1),
        config,
        node: node.clone(),
        arbiter: actix::Arbiter::current(),
        orphaned: std::sync::Mutex::new(None),
        session: Default::default(),
        leaders: leader::Leaders::new(&options.coordinator),
    });
    leader::spawn_watches(&state, &options.name);
    let peers = tokio::spawn(session::accept_peers(state.clone()));
    let orphans = tokio::spawn(session::unload_orphans(state.clone(), options.adopt_grace));
    let idle = tokio::spawn(forget_idle_models(state.clone()));
    let outcome = reconnecting(options, &state, infos, ready, stopped).await;
    peers.abort();
    orphans.abort();
    idle.abort();
    stop_all(state.router.remove_all()).await;
    state.router.peers.close().await;
    outcome
}

/// [`session`] again (with back-off) while the coordinator can be reached
/// again, until `stopped` turns true.
async fn reconnecting(
    options: &WorkerOptions,
    state: &Arc<State>,
    infos: &[DeviceInfo],
    ready: impl FnOnce(&str),
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    let mut ready = Some(ready);
    let mut backoff = RECONNECT;
    loop {
        let started = Instant::now();
        let outcome = session(options, state, infos, &mut ready, &stopped).await;
        let error = match outcome {
            Err(e) if options.reconnect && e.transient() && !*stopped.borrow() => e,
            outcome => return outcome,
        };
        if let WorkerError::NewLeader(why) = &error {
            tracing::info!("{why}: registering with it");
            continue;
        }
        if matches!(error, WorkerError::NoLeader(_)) {
            // A standby is taking over: news of it ends the wait at once.
            backoff.reset();
        }
        let wait = backoff.wait_after(started.elapsed());
        tracing::warn!("{error}; dialling the coordinator again in {wait:?}");
        let mut news = state.leaders.news.subscribe();
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = news.changed() => {}
            _ = stopped.wait_for(|s| *s) => return Ok(()),
        }
    }
}

impl State {
    /// The coordinator of this session adopted what is deployed here.
    fn adopted(&self) {
        if let Ok(mut o) = self.orphaned.lock() {
            *o = None;
        }
    }

    /// The coordinator is lost: what is deployed here is orphaned from now
    /// (unless it already was).
    fn orphaned(&self) {
        if let Ok(mut o) = self.orphaned.lock() {
            o.get_or_insert_with(Instant::now);
        }
    }

    /// A new registration's number.
    fn next_session(&self) -> u64 {
        self.session
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1
    }

    /// The registration now.
    fn session(&self) -> u64 {
        self.session.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn orphaned_since(&self) -> Option<Instant> {
        self.orphaned.lock().ok().and_then(|o| *o)
    }

    pub(super) fn device(&self, kind: &str) -> Result<&Device, operations::OperationError> {
        self.devices.iter().find(|d| d.kind == kind).ok_or_else(|| {
            operations::OperationError::NoDevice {
                worker: self.name.clone(),
                device: kind.to_string(),
                serves: self.devices.iter().map(|d| d.kind.clone()).collect(),
            }
        })
    }
}
