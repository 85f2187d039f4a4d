//! One session with the coordinator: dial and register, then serve it
//! (heartbeats, its operations) and the data channel (requesters'
//! requests, other workers' intermediate tensors) until it goes away; then
//! drop everything the session deployed.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_common::wire::cluster::{CoordinatorAnswer, WorkerReport};
use tessera_common::wire::control::DeviceInfo;
use tessera_common::wire::handshake::Role;
use tessera_common::wire::peer::PeerMessage;
use tessera_common::wire::{Frame, Limits};
use tessera_net::{exchange, recv_frame, ExchangeError, Link, Node, Peer};

use super::actor::stop_all;
use super::cache::CompileCache;
use super::routes::Router;
use super::{operations, Device, State, WorkerError, WorkerOptions};
use crate::plugin::Config;

/// A registration the coordinator accepted.
struct Registered {
    connection: quinn::Connection,
    /// The control stream: heartbeats go out on it; its end means the
    /// coordinator is gone.
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    data_addr: String,
    heartbeat: Duration,
}

/// One registration: serves the coordinator until it goes away (an error)
/// or `stopped` turns true (`Ok`). Everything deployed in it is stopped at
/// the end, and waited for.
pub(super) async fn session<R: FnOnce(&str)>(
    options: &WorkerOptions,
    node: &Arc<Node>,
    devices: Vec<Device>,
    infos: &[DeviceInfo],
    ready: &mut Option<R>,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    let mut stop = stopped.clone();
    let registered = tokio::select! {
        registered = register(options, node, infos) => registered?,
        _ = stop.wait_for(|s| *s) => return Ok(()),
    };
    let Registered {
        connection,
        send,
        recv,
        data_addr,
        heartbeat,
    } = registered;
    let limits = *node.limits();
    let control = Link::on_stream(connection.clone(), send, "coordinator", limits, 256);
    let router = Arc::new(Router::new(&options.name, node.clone()));
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
    spawn_heartbeats(control, router.clone(), heartbeat);
    // Connections requesters and other workers opened in this session:
    // closed at its end, so that they dial this worker's next session
    // instead of streaming into this one's router.
    let incoming: Arc<Mutex<Vec<quinn::Connection>>> = Default::default();
    let peers = tokio::spawn(accept_peers(state.clone(), incoming.clone()));
    let why = tokio::select! {
        why = serve_operations(connection.clone(), state) => why,
        why = watch_control(recv, limits) => why,
        _ = stop.wait_for(|s| *s) => String::new(),
    };
    // Stop everything of this session (the compute threads finish the
    // request they run, then drop their sessions); the endpoint stays for
    // the next.
    peers.abort();
    stop_all(router.remove_all()).await;
    router.close_peers().await;
    if let Ok(all) = incoming.lock() {
        for c in all.iter() {
            tessera_net::CloseCode::SessionOver.close(c, "session over");
        }
    }
    if *stop.borrow() {
        tessera_net::CloseCode::Shutdown.close(&connection, "shutdown");
        return Ok(());
    }
    tessera_net::CloseCode::SessionOver.close(&connection, "session over");
    Err(WorkerError::CoordinatorLost(
        connection
            .close_reason()
            .map(|r| r.to_string())
            .unwrap_or(why),
    ))
}

/// Dials the coordinator and registers this worker's devices.
async fn register(
    options: &WorkerOptions,
    node: &Arc<Node>,
    infos: &[DeviceInfo],
) -> Result<Registered, WorkerError> {
    let coordinator = tessera_net::resolve(&options.coordinator).await?;
    let Peer {
        connection,
        mut send,
        mut recv,
        ..
    } = node.dial(coordinator).await?;
    let data_addr = match &options.advertise {
        Some(a) => a.clone(),
        None => advertised(node, &connection, coordinator)?,
    };
    let limits = *node.limits();
    let register = WorkerReport::Register {
        name: options.name.clone(),
        data_addr: data_addr.clone(),
        devices: infos.to_vec(),
    };
    exchange::send_message(&mut send, &register, None, &limits).await?;
    let heartbeat = match exchange::answer::<CoordinatorAnswer>(&mut recv, &limits, |_| {}).await {
        Ok(CoordinatorAnswer::Registered { heartbeat_ms }) => {
            Duration::from_millis(heartbeat_ms.max(50))
        }
        Ok(CoordinatorAnswer::Failed(refused)) => {
            return Err(WorkerError::Registration(refused.error))
        }
        Err(ExchangeError::Net(e)) => return Err(e.into()),
        Err(e) => return Err(WorkerError::Registration(e.to_string())),
    };
    tracing::info!(name = %options.name, %data_addr, "registered with the coordinator");
    Ok(Registered {
        connection,
        send,
        recv,
        data_addr,
        heartbeat,
    })
}

/// The address other workers dial: the bound one, with the address the
/// coordinator is reached from when bound to every interface.
fn advertised(
    node: &Node,
    connection: &quinn::Connection,
    coordinator: SocketAddr,
) -> Result<String, WorkerError> {
    let mut bound = node.local_addr()?;
    if bound.ip().is_unspecified() {
        if let Some(ip) = connection
            .local_ip()
            .or_else(|| local_ip_towards(coordinator))
        {
            bound.set_ip(ip);
        }
    }
    Ok(bound.to_string())
}

/// Heartbeats on the control stream, every `every`, with what the
/// deployments here did and hold (their subgraphs' load, their sequences,
/// the links' speed); they stop with the stream.
fn spawn_heartbeats(control: Link, router: Arc<Router>, every: Duration) {
    tokio::spawn(async move {
        let mut seq = 0;
        loop {
            tokio::time::sleep(every).await;
            seq += 1;
            router.requests.sweep();
            let beat = WorkerReport::Heartbeat {
                seq,
                in_flight: router.in_flight(),
                subgraphs: router.subgraph_loads(),
                sequences: router.sequence_loads(),
                links: router.link_rates(),
                rss_bytes: super::resident_bytes(),
            };
            if control.send_control(&beat).await.is_err() {
                break;
            }
        }
    });
}

/// Accepts the connections of requesters (clients, front doors, the
/// coordinator's front door) and other workers, remembering each in
/// `incoming`.
async fn accept_peers(state: Arc<State>, incoming: Arc<Mutex<Vec<quinn::Connection>>>) {
    // Each connection handshakes on its own task (one slow peer holds up
    // no other).
    while let Some(connecting) = state.node.incoming().await {
        let (state, incoming) = (state.clone(), incoming.clone());
        tokio::spawn(async move {
            let roles = [Role::Worker, Role::Client, Role::Coordinator];
            match state.node.handshake(connecting, &roles).await {
                Ok(peer) => {
                    tracing::debug!(peer = %peer.hello.node, role = ?peer.hello.role, "connected");
                    if let Ok(mut all) = incoming.lock() {
                        all.retain(|c| c.close_reason().is_none());
                        all.push(peer.connection.clone());
                    }
                    super::data::serve_connection(state, peer).await;
                }
                Err(e) => tracing::warn!("refused a peer: {e}"),
            }
        });
    }
}

/// Operations from the coordinator, one per stream, until the connection
/// ends; returns why.
async fn serve_operations(connection: quinn::Connection, state: Arc<State>) -> String {
    loop {
        let (send, recv) = match connection.accept_bi().await {
            Ok(s) => s,
            Err(e) => return e.to_string(),
        };
        tokio::spawn(operations::serve_operation(state.clone(), send, recv));
    }
}

/// Reads the control stream until it ends (the coordinator is gone);
/// returns why.
async fn watch_control(mut recv: quinn::RecvStream, limits: Limits) -> String {
    loop {
        match recv_frame::<CoordinatorAnswer>(&mut recv, &limits).await {
            Ok(Some(frame)) => tracing::debug!("control frame {:?}", frame.kind()),
            Ok(None) => return "it closed the control stream".to_string(),
            Err(e) => return e.to_string(),
        }
    }
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

/// Tensor frames from worker `from` → local actors; each arrival is
/// counted for the link (and reported to its requester with counters).
pub(super) fn tensor_handler(
    router: Arc<Router>,
    from: String,
) -> impl Fn(
    Frame<PeerMessage>,
    Duration,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
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
                    let sequence = header.sequence.clone();
                    let name: Arc<str> = header.name.as_str().into();
                    let bytes = payload.len() as u64;
                    match header.into_tensor(payload) {
                        Ok(t) => {
                            if !name.is_empty() {
                                router.moved(request, &name, &from, bytes, took);
                            }
                            router
                                .dispatch(network, request, sequence.as_ref(), name.clone(), t)
                                .await;
                        }
                        Err(e) => router.fail(request, format!("bad tensor: {e}")),
                    }
                }
                Frame::Control(none, _) => match none {},
                Frame::Handshake(_) => tracing::warn!("unexpected handshake on a data stream"),
            }
        })
    }
}
