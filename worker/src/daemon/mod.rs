//! The worker daemon: serves this machine's device plugins to a cluster.
//!
//! It dials the coordinator (mutual TLS), registers its devices with their
//! metrics and sends heartbeats on the connection's control stream. The
//! coordinator opens one bidirectional stream per operation (QueryNetwork,
//! Deploy, Undeploy, Cancel); tensors arrive on unidirectional streams from
//! the coordinator (graph inputs) and from other workers (intermediate
//! tensors), and are dispatched to one actix actor per deployed subgraph
//! ([`actor`]); outputs stream to their consumers ([`routes`]). Compiled
//! subgraphs are cached on disk by model hash ([`cache`]).
//!
//! [`run`] must be called inside an actix system on a tokio multi-thread
//! runtime (`actix_rt::System::with_tokio_rt`).

pub mod actor;
pub mod cache;
pub mod config;
pub mod routes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Actor;
use bytes::Bytes;
use tessera_common::onnx::decode_model;
use tessera_common::wire::control::{Control, DeploySpec, Destination, DeviceAnswer, DeviceInfo};
use tessera_common::wire::handshake::Role;
use tessera_common::wire::Frame;
use tessera_net::{recv_frame, send_frame, serve_streams, Link, NetError, Node, Peer};

use crate::plugin::{Config, DevicePlugin, MetricValue, PluginError};
use crate::plugins;
use actor::{Stop, SubgraphActor};
use cache::CompileCache;
use routes::Router;

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
    /// The coordinator, `host:port`.
    pub coordinator: String,
    /// Dial the coordinator again (with back-off) when it goes away or
    /// cannot be reached, instead of returning.
    pub reconnect: bool,
    pub cluster: String,
    /// Bounded mailbox of each subgraph actor.
    pub mailbox: usize,
    /// Where compiled subgraphs are cached (none: no cache).
    pub cache_dir: Option<PathBuf>,
    /// Plugin configuration (e.g. `NUM_THREADS`) for every compile.
    pub config: Vec<(String, String)>,
}

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
        match self {
            WorkerError::CoordinatorLost(_) => true,
            WorkerError::Net(NetError::Stream(_) | NetError::Resolve { .. }) => true,
            WorkerError::Net(NetError::Connect { reason, .. }) => {
                !reason.contains("handshake failed") && !reason.contains("certificate")
            }
            _ => false,
        }
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

fn device_info(d: &Device) -> DeviceInfo {
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
        metrics: Vec::new(),
    }
}

struct State {
    name: String,
    devices: Vec<Device>,
    router: Arc<Router>,
    cache: Option<CompileCache>,
    mailbox: usize,
    config: Config,
    node: Arc<Node>,
    /// The actix system's arbiter: actors start there (not from tokio tasks).
    arbiter: actix::ArbiterHandle,
}

/// The longest wait between two tries to reach the coordinator.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

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
    let (devices, infos) = tokio::task::spawn_blocking(move || {
        let devices = open_devices(&kinds, &config)?;
        let infos: Vec<DeviceInfo> = devices.iter().map(device_info).collect();
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
    let serving = serve_sessions(&options, &node, devices, &infos, ready);
    tokio::select! {
        outcome = serving => outcome,
        () = stop => {
            tracing::info!("shutting down: closing every connection");
            node.shutdown().await;
            Ok(())
        }
    }
}

/// Sessions with the coordinator, one after another while it can be
/// reached again.
async fn serve_sessions(
    options: &WorkerOptions,
    node: &Arc<Node>,
    devices: Vec<Device>,
    infos: &[DeviceInfo],
    ready: impl FnOnce(&str),
) -> Result<(), WorkerError> {
    let mut ready = Some(ready);
    let mut backoff = Duration::from_millis(100);
    loop {
        let started = Instant::now();
        let error = match session(options, node, devices.clone(), infos, &mut ready).await {
            Err(e) if options.reconnect && e.transient() => e,
            outcome => {
                node.shutdown().await;
                return outcome;
            }
        };
        if started.elapsed() > Duration::from_secs(10) {
            backoff = Duration::from_millis(100);
        }
        tracing::warn!("{error}; dialling the coordinator again in {backoff:?}");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One registration: serves the coordinator until it goes away. Everything
/// deployed in it is dropped at the end.
async fn session<R: FnOnce(&str)>(
    options: &WorkerOptions,
    node: &Arc<Node>,
    devices: Vec<Device>,
    infos: &[DeviceInfo],
    ready: &mut Option<R>,
) -> Result<(), WorkerError> {
    let coordinator = tessera_net::resolve(&options.coordinator).await?;
    let Peer {
        connection,
        mut send,
        mut recv,
        ..
    } = node.dial(coordinator).await?;
    let data_addr = match &options.advertise {
        Some(a) => a.clone(),
        None => {
            let mut bound = node.local_addr()?;
            if bound.ip().is_unspecified() {
                // Bound to every interface: advertise the one the
                // coordinator is reached from.
                if let Some(ip) = connection
                    .local_ip()
                    .or_else(|| local_ip_towards(coordinator))
                {
                    bound.set_ip(ip);
                }
            }
            bound.to_string()
        }
    };
    let limits = *node.limits();
    let register = Control::Register {
        name: options.name.clone(),
        data_addr: data_addr.clone(),
        devices: infos.to_vec(),
    };
    send_frame(
        &mut send,
        &register.encode(0, &limits).map_err(NetError::from)?,
        None,
    )
    .await?;
    let heartbeat = match recv_frame(&mut recv, &limits).await? {
        Some(Frame::Control(Control::Registered { heartbeat_ms }, _)) => {
            Duration::from_millis(heartbeat_ms.max(50))
        }
        Some(Frame::Control(Control::Failed { error, .. }, _)) => {
            return Err(WorkerError::Registration(error))
        }
        other => {
            return Err(WorkerError::Registration(format!(
                "unexpected answer: {other:?}"
            )))
        }
    };
    tracing::info!(name = %options.name, %data_addr, "registered with the coordinator");
    let control = Link::on_stream(connection.clone(), send, "coordinator", limits, 256);
    let to_coordinator = Link::open(connection.clone(), "coordinator", limits, 64);
    let router = Arc::new(Router::new(
        &options.name,
        node.clone(),
        to_coordinator,
        control.clone(),
    ));
    let mut config = Config::default();
    for (k, v) in &options.config {
        config.set(k, v)?;
    }
    let state = Arc::new(State {
        name: options.name.clone(),
        devices,
        router: router.clone(),
        cache: options.cache_dir.clone().map(CompileCache::new),
        mailbox: options.mailbox.max(1),
        config,
        node: node.clone(),
        arbiter: actix::Arbiter::current(),
    });
    if let Some(ready) = ready.take() {
        ready(&data_addr);
    }

    // Heartbeats on the control stream.
    let (beats, counting) = (control.clone(), router.clone());
    tokio::spawn(async move {
        let mut seq = 0;
        loop {
            tokio::time::sleep(heartbeat).await;
            seq += 1;
            let beat = Control::Heartbeat {
                seq,
                in_flight: counting.in_flight(),
                mailboxes: counting.mailbox_depths(),
            };
            if beats.send_control(&beat).await.is_err() {
                break;
            }
        }
    });
    // Graph inputs from the coordinator.
    tokio::spawn(serve_streams(
        connection.clone(),
        limits,
        tensor_handler(router.clone(), "coordinator".into()),
    ));
    // Intermediate tensors from other workers.
    let accepting = state.clone();
    // Connections other workers opened in this session: closed at its end,
    // so that they dial this worker's next session instead of streaming
    // into this one's router.
    let incoming: Arc<std::sync::Mutex<Vec<quinn::Connection>>> = Default::default();
    let accepted = incoming.clone();
    let peers = tokio::spawn(async move {
        while let Some(peer) = accepting.node.accept(&[Role::Worker]).await {
            match peer {
                Ok(peer) => {
                    tracing::debug!(peer = %peer.hello.node, "worker connected");
                    if let Ok(mut all) = accepted.lock() {
                        all.retain(|c| c.close_reason().is_none());
                        all.push(peer.connection.clone());
                    }
                    tokio::spawn(serve_streams(
                        peer.connection,
                        limits,
                        tensor_handler(accepting.router.clone(), peer.hello.node.clone()),
                    ));
                }
                Err(e) => tracing::warn!("refused a peer: {e}"),
            }
        }
    });
    // Operations from the coordinator, one per stream; the control stream
    // ending means the coordinator is gone.
    let ops = {
        let connection = connection.clone();
        let state = state.clone();
        async move {
            loop {
                let (send, recv) = match connection.accept_bi().await {
                    Ok(s) => s,
                    Err(e) => return e.to_string(),
                };
                tokio::spawn(serve_operation(state.clone(), send, recv));
            }
        }
    };
    let watch = async move {
        loop {
            match recv_frame(&mut recv, &limits).await {
                Ok(Some(frame)) => tracing::debug!("control frame {:?}", frame.kind()),
                Ok(None) => return "it closed the control stream".to_string(),
                Err(e) => return e.to_string(),
            }
        }
    };
    let why = tokio::select! {
        why = ops => why,
        why = watch => why,
    };
    // Drop everything of this session; the endpoint stays for the next.
    peers.abort();
    for actor in router.remove_all() {
        actor.do_send(Stop);
    }
    router.close_peers().await;
    if let Ok(all) = incoming.lock() {
        for c in all.iter() {
            tessera_net::CloseCode::SessionOver.close(c, "session over");
        }
    }
    tessera_net::CloseCode::SessionOver.close(&connection, "session over");
    Err(WorkerError::CoordinatorLost(
        connection
            .close_reason()
            .map(|r| r.to_string())
            .unwrap_or(why),
    ))
}

/// The local address the kernel routes to `remote` from (a connected UDP
/// socket sends nothing).
fn local_ip_towards(remote: SocketAddr) -> Option<std::net::IpAddr> {
    let any = if remote.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = std::net::UdpSocket::bind(any).ok()?;
    socket.connect(remote).ok()?;
    socket.local_addr().ok().map(|a| a.ip())
}

/// Tensor frames from peer `from` → local actors; each arrival is reported
/// to the coordinator as a transfer.
fn tensor_handler(
    router: Arc<Router>,
    from: String,
) -> impl Fn(Frame, Duration) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
       + Clone
       + Send
       + Sync
       + 'static {
    let from: Arc<str> = from.into();
    move |frame, took| {
        let (router, from) = (router.clone(), from.clone());
        Box::pin(async move {
            match frame {
                Frame::Tensor(header, payload) => {
                    let (network, request) = (header.network, header.request);
                    let name: Arc<str> = header.name.as_str().into();
                    let bytes = payload.len() as u64;
                    if network == 0 {
                        // The coordinator's bandwidth probe.
                        router.moved(request, &name, &from, bytes, took).await;
                        return;
                    }
                    match header.into_tensor(payload) {
                        Ok(t) => {
                            router.dispatch(network, request, name.clone(), t).await;
                            if !name.is_empty() {
                                router.moved(request, &name, &from, bytes, took).await;
                            }
                        }
                        Err(e) => router.fail(request, format!("bad tensor: {e}")).await,
                    }
                }
                other => tracing::warn!("unexpected {:?} frame on a data stream", other.kind()),
            }
        })
    }
}

/// One operation stream from the coordinator.
async fn serve_operation(
    state: Arc<State>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let limits = *state.node.limits();
    let reply = match recv_frame(&mut recv, &limits).await {
        Ok(Some(Frame::Control(msg, payload))) => operation(&state, msg, payload, &mut send).await,
        Ok(Some(other)) => Err(format!(
            "expected an operation, got a {:?} frame",
            other.kind()
        )),
        Ok(None) => return,
        Err(e) => Err(e.to_string()),
    };
    let reply = reply.unwrap_or_else(|error| {
        tracing::warn!("{error}");
        Control::Failed {
            request: None,
            error,
        }
    });
    if let Ok(head) = reply.encode(0, &limits) {
        let _ = send_frame(&mut send, &head, None).await;
    }
    let _ = send.finish();
}

async fn operation(
    state: &Arc<State>,
    msg: Control,
    payload: Bytes,
    send: &mut quinn::SendStream,
) -> Result<Control, String> {
    match msg {
        Control::QueryNetwork { devices } => {
            let model = decode_model(&payload).map_err(|e| format!("QueryNetwork: {e}"))?;
            let state = state.clone();
            tokio::task::spawn_blocking(move || {
                let mut answers = Vec::new();
                for kind in &devices {
                    let device = state.device(kind)?;
                    let r = device
                        .plugin
                        .query_network(&model)
                        .map_err(|e| format!("{}/{kind} QueryNetwork: {e}", state.name))?;
                    answers.push(DeviceAnswer {
                        device: kind.clone(),
                        supported: r.supported.into_iter().collect(),
                        unsupported: r.unsupported.into_iter().collect(),
                        types: r
                            .types
                            .into_values()
                            .map(|s| {
                                let dims = s.shape.map(|d| {
                                    d.iter().map(|v| v.map_or(-1, |v| v as i64)).collect()
                                });
                                (s.name, s.elem.0, dims)
                            })
                            .collect(),
                    });
                }
                Ok(Control::QueryResult { answers })
            })
            .await
            .map_err(|e| e.to_string())?
        }
        Control::Deploy(spec) => deploy(state, spec, payload, send).await,
        Control::Undeploy { network } => {
            for actor in state.router.remove(network) {
                actor.do_send(Stop);
            }
            Ok(Control::Unloaded { network })
        }
        Control::Cancel { request } => {
            state.router.forget(request);
            Ok(Control::Cancel { request })
        }
        other => Err(format!("a worker does not take {}", other.name())),
    }
}

impl State {
    fn device(&self, kind: &str) -> Result<&Device, String> {
        self.devices.iter().find(|d| d.kind == kind).ok_or_else(|| {
            let have: Vec<&str> = self.devices.iter().map(|d| d.kind.as_str()).collect();
            format!(
                "{} has no device {kind}; it serves {}",
                self.name,
                have.join(", ")
            )
        })
    }
}

/// Compiles (or loads from the cache) one subgraph and starts its actor.
async fn deploy(
    state: &Arc<State>,
    spec: DeploySpec,
    model: Bytes,
    send: &mut quinn::SendStream,
) -> Result<Control, String> {
    let limits = *state.node.limits();
    let what = format!(
        "compiling subgraph {} on {}/{}",
        spec.subgraph, state.name, spec.device
    );
    let progress = Control::Progress {
        what: what.clone(),
        done: 0,
        total: 1,
    };
    if let Ok(head) = progress.encode(0, &limits) {
        let _ = send_frame(send, &head, None).await;
    }
    let plugin = state.device(&spec.device)?.plugin.clone();
    let cache = state.cache.clone();
    let config = state.config.clone();
    let key = format!("{}-{}", spec.device, spec.model_hash);
    let started = Instant::now();
    let (compiled, cached) = tokio::task::spawn_blocking(move || {
        if let Some(cache) = &cache {
            if let Some(blob) = cache.get(&key) {
                match plugin.import(&blob) {
                    Ok(c) => return Ok((c, true)),
                    Err(e) => tracing::warn!("cached subgraph {key} unusable, recompiling: {e}"),
                }
            }
        }
        let compiled = plugin.compile(&model, &config).map_err(|e| e.to_string())?;
        if let Some(cache) = &cache {
            match compiled.export() {
                Ok(blob) => cache.put(&key, &blob),
                Err(e) => tracing::debug!("not caching {key}: {e}"),
            }
        }
        Ok::<_, String>((compiled, false))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("{what}: {e}"))?;
    let compile_ms = started.elapsed().as_millis() as u64;
    tracing::info!(subgraph = spec.subgraph, device = %spec.device, compile_ms, cached, "deployed");
    let inputs: Vec<Arc<str>> = spec.inputs.iter().map(|n| n.as_str().into()).collect();
    let outputs: Vec<Arc<str>> = spec
        .outputs
        .iter()
        .map(|r| r.tensor.as_str().into())
        .collect();
    let routes = spec
        .outputs
        .iter()
        .map(|r| (Arc::<str>::from(r.tensor.as_str()), r.to.clone()))
        .collect();
    let actor = SubgraphActor::new(
        spec.network,
        spec.subgraph,
        format!("{}/{}", state.name, spec.device),
        compiled,
        inputs.clone(),
        outputs,
        state.router.clone(),
        state.mailbox,
    );
    let actor = SubgraphActor::start_in_arbiter(&state.arbiter, move |_| actor);
    state.router.add(spec.network, &actor, &inputs, routes);
    // Dial the workers this subgraph streams to now, not on the first
    // request.
    for route in &spec.outputs {
        for dest in &route.to {
            if let Destination::Worker { name, addr } = dest {
                if *name != state.name {
                    let (router, name, addr) = (state.router.clone(), name.clone(), addr.clone());
                    tokio::spawn(async move {
                        if let Err(e) = router.peer(&name, &addr).await {
                            tracing::warn!("{e}");
                        }
                    });
                }
            }
        }
    }
    Ok(Control::Deployed {
        network: spec.network,
        subgraph: spec.subgraph,
        compile_ms,
        cached,
    })
}
