//! The embedded local cluster: an in-process coordinator and workers that
//! talk real QUIC with mutual TLS on loopback, with throw-away certificates
//! made in memory (no set-up for a new user). Must run inside an actix
//! system on a tokio runtime (see [`run_system`]).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tessera_common::backoff::Backoff;
use tessera_coordinator::config::CoordinatorConfig;
use tessera_coordinator::Coordinator;
use tessera_net::certs::{self, NodeIdentity};
use tessera_worker::daemon::config::MemoryLimits;
use tessera_worker::daemon::{self, WorkerOptions};

pub const CLUSTER: &str = "local";

/// A running embedded cluster.
pub struct Embedded {
    pub coordinator: Coordinator,
    pub addr: SocketAddr,
    /// The coordinator's front door, with `http_listen` or `grpc_listen`.
    pub front_door: Option<tessera_serving::FrontDoor>,
    /// The client's identity (same throw-away CA).
    pub client: NodeIdentity,
    pub workers: Vec<String>,
    /// Each worker's stop signal, by name.
    stops: Vec<(String, tokio::sync::oneshot::Sender<()>)>,
    /// Each worker's task: it ends once the worker has stopped its
    /// subgraphs (their compute threads joined, their sessions dropped)
    /// and closed its connections.
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// How long [`Embedded::shutdown`] waits for its workers to stop (each
/// finishes the request it computes first).
const STOP_WAIT: Duration = Duration::from_secs(120);

impl Embedded {
    /// Shuts the cluster down in order: the coordinator first (so that
    /// nothing is re-planned), then every worker, waiting until each has
    /// stopped its subgraphs' compute threads and dropped their backend
    /// sessions and devices. Call it before the runtime goes: a compute
    /// thread still running while the process exits races the backends'
    /// own teardown (onnxruntime's and Mesa's static destructors).
    pub async fn shutdown(self) {
        if let Some(door) = &self.front_door {
            door.shutdown();
        }
        self.coordinator.shutdown().await;
        stop_tasks(self.stops, self.tasks).await;
    }

    /// Stops these workers at once, as SIGTERM stops a worker process:
    /// every connection closed, so the coordinator re-plans without waiting
    /// for a heartbeat timeout. Unknown or already stopped names are an
    /// error.
    pub fn stop_workers(&mut self, names: &[&str]) -> Result<()> {
        for name in names {
            let at = self
                .stops
                .iter()
                .position(|(n, _)| n == name)
                .ok_or_else(|| anyhow::anyhow!("no running embedded worker {name}"))?;
            let (_, stop) = self.stops.swap_remove(at);
            let _ = stop.send(());
        }
        Ok(())
    }
}

/// Sends every stop and waits (up to [`STOP_WAIT`]) for the tasks to end.
async fn stop_tasks(
    stops: Vec<(String, tokio::sync::oneshot::Sender<()>)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) {
    for (_, stop) in stops {
        let _ = stop.send(());
    }
    let all = futures_util::future::join_all(tasks);
    if tokio::time::timeout(STOP_WAIT, all).await.is_err() {
        tracing::warn!("embedded workers did not stop within {STOP_WAIT:?}");
    }
}

/// Worker names: node-a, node-b, ...
pub fn worker_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let letter = (b'a' + (i % 26) as u8) as char;
            if i < 26 {
                format!("node-{letter}")
            } else {
                format!("node-{letter}{}", i / 26)
            }
        })
        .collect()
}

/// How long an embedded cluster waits for its workers to register. A GPU
/// worker on a software adapter (lavapipe) started in 9 s on two idle
/// cores, and in more than 30 s beside another lavapipe process; the wait
/// costs nothing when they come sooner.
const REGISTRATION_WAIT: Duration = Duration::from_secs(120);

/// One embedded worker: what it serves, its plugin configuration, its
/// devices' memory limits.
#[derive(Debug, Clone, Default)]
pub struct WorkerSpec {
    pub devices: Vec<String>,
    pub config: Vec<(String, String)>,
    pub memory_limit: MemoryLimits,
}

impl WorkerSpec {
    pub fn new(devices: &[String], config: &[(String, String)]) -> WorkerSpec {
        WorkerSpec {
            devices: devices.to_vec(),
            config: config.to_vec(),
            memory_limit: MemoryLimits::default(),
        }
    }
}

/// Starts a coordinator and `workers` workers serving `devices`, each
/// compiling with `plugin_config`; returns once all have registered.
pub async fn start(
    workers: usize,
    devices: &[String],
    plugin_config: &[(String, String)],
) -> Result<Embedded> {
    start_configured(workers, devices, plugin_config, |_| {}).await
}

/// [`start`] with the coordinator's configuration changed by `configure`
/// first (e.g. `http_listen`).
pub async fn start_configured(
    workers: usize,
    devices: &[String],
    plugin_config: &[(String, String)],
    configure: impl FnOnce(&mut CoordinatorConfig),
) -> Result<Embedded> {
    let specs = vec![WorkerSpec::new(devices, plugin_config); workers];
    start_workers(&specs, configure).await
}

/// An embedded worker's options.
fn embedded_worker(name: &str, spec: &WorkerSpec, coordinator: SocketAddr) -> WorkerOptions {
    WorkerOptions {
        name: name.to_string(),
        devices: spec.devices.clone(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        advertise: None,
        coordinator: coordinator.to_string(),
        reconnect: false,
        cluster: CLUSTER.into(),
        mailbox: 64,
        cache_dir: None,
        cache_limit: 0,
        models_dirs: Vec::new(),
        config: spec.config.clone(),
        memory_limit: spec.memory_limit.clone(),
        adopt_grace: tessera_worker::daemon::ADOPT_GRACE,
        // Its workers stop with it (nobody to move anything to).
        drain_timeout: Duration::ZERO,
    }
}

/// A coordinator and one worker per spec (named node-a, node-b, ...),
/// the coordinator's configuration changed by `configure` first; returns
/// once all have registered.
pub async fn start_workers(
    specs: &[WorkerSpec],
    configure: impl FnOnce(&mut CoordinatorConfig),
) -> Result<Embedded> {
    let workers = specs.len();
    if workers == 0 {
        bail!("an embedded cluster needs at least one worker");
    }
    let names = worker_names(workers);
    let mut all: Vec<&str> = vec!["coordinator", "client"];
    all.extend(names.iter().map(String::as_str));
    let ids = certs::ephemeral(CLUSTER, &all)?;
    let mut config = CoordinatorConfig {
        cluster: CLUSTER.into(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..Default::default()
    };
    configure(&mut config);
    let coordinator = Coordinator::bind(config.clone(), &ids[0])?;
    let addr = coordinator.local_addr()?;
    let serving = coordinator.clone();
    tokio::spawn(async move { serving.serve().await });
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    for ((name, id), spec) in names.iter().zip(&ids[2..]).zip(specs) {
        let options = embedded_worker(name, spec, addr);
        let id = id.clone();
        let name = name.clone();
        let coordinator = coordinator.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        stops.push((name.clone(), stop));
        // Only an explicit stop ends it (not the sender dropped).
        let stopped = futures_util::FutureExt::shared(Box::pin(async move {
            if stopped.await.is_err() {
                std::future::pending::<()>().await
            }
        }));
        tasks.push(actix::spawn(async move {
            let registered = std::sync::atomic::AtomicBool::new(false);
            let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
            loop {
                let ready = |_: &str| registered.store(true, std::sync::atomic::Ordering::Relaxed);
                let outcome = daemon::run_until(options.clone(), &id, ready, stopped.clone()).await;
                let Err(e) = outcome else { break };
                if coordinator.shared().shutting_down() {
                    tracing::debug!(worker = %name, "stopped with the cluster: {e}");
                    break;
                }
                // As a real worker does: dial again (many workers starting
                // at once on a loaded machine can miss their registration,
                // or a heartbeat, and be dropped).
                if registered.load(std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(worker = %name, "dropped ({e}); joining again");
                } else {
                    tracing::warn!(worker = %name, "could not register ({e}); dialling again");
                }
                tokio::time::sleep(backoff.wait()).await;
            }
        }));
    }
    let started = Instant::now();
    while coordinator.workers().len() < workers {
        if started.elapsed() > REGISTRATION_WAIT {
            let registered = coordinator.workers();
            let missing: Vec<&String> = names.iter().filter(|n| !registered.contains(n)).collect();
            coordinator.shutdown().await;
            stop_tasks(stops, tasks).await;
            bail!(
                "embedded workers did not register within {} s: missing {missing:?} ({} of {workers} registered)",
                REGISTRATION_WAIT.as_secs(),
                registered.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let front_door = crate::front_door::of_coordinator(&coordinator, &config, &ids[0]).await?;
    Ok(Embedded {
        coordinator,
        addr,
        front_door,
        client: ids[1].clone(),
        workers: names,
        stops,
        tasks,
    })
}

/// Runs `f` inside an actix system on a tokio multi-thread runtime (actors
/// on the system thread, QUIC on tokio's threads; each subgraph computes
/// on a thread of its own).
pub fn run_system<F, T>(f: F) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting a tokio runtime")?;
    let system = actix::System::with_tokio_rt(move || runtime);
    system.block_on(f)
}
