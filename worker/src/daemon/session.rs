//! One session with the coordinator: dial and register (reporting what
//! this worker still serves from an earlier session), unload what the
//! coordinator did not adopt, then serve it (heartbeats, its operations)
//! until it goes away. The deployments, actors, routes, peer links and
//! sequences' state outlive the session: requesters and other workers
//! keep using them while no coordinator is there ([`unload_orphans`]
//! unloads them once none has adopted them for the grace period).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_common::wire::cluster::{CoordinatorAnswer, WorkerReport};
use tessera_common::wire::control::DeviceInfo;
use tessera_common::wire::handshake::Role;
use tessera_common::wire::peer::PeerMessage;
use tessera_common::wire::{Frame, Limits};
use tessera_net::{exchange, recv_frame, ExchangeError, Link, Node, Peer};

use super::actor::stop_all;
use super::routes::Router;
use super::{operations, State, WorkerError, WorkerOptions};

/// A registration the coordinator accepted.
struct Registered {
    connection: quinn::Connection,
    /// The control stream: heartbeats go out on it; its end means the
    /// coordinator is gone.
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    data_addr: String,
    heartbeat: Duration,
    /// The deployments it serves of those this worker holds.
    adopted: Vec<u64>,
    epoch: u64,
}

/// One registration: serves the coordinator until it goes away (an error)
/// or `stopped` turns true (`Ok`). What is deployed here stays deployed
/// either way (the caller stops it at the end).
pub(super) async fn session<R: FnOnce(&str)>(
    options: &WorkerOptions,
    state: &Arc<State>,
    infos: &[DeviceInfo],
    ready: &mut Option<R>,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    let mut stop = stopped.clone();
    let registered = tokio::select! {
        registered = register(options, state, infos) => registered?,
        _ = stop.wait_for(|s| *s) => return Ok(()),
    };
    let Registered {
        connection,
        send,
        recv,
        data_addr,
        heartbeat,
        adopted,
        epoch,
    } = registered;
    let session = state.next_session();
    state.adopted();
    unload_unadopted(&state.router, &adopted, epoch).await;
    let limits = *state.node.limits();
    let control = Link::on_stream(connection.clone(), send, "coordinator", limits, 256);
    if let Some(ready) = ready.take() {
        ready(&data_addr);
    }
    spawn_heartbeats(control.clone(), state.router.clone(), heartbeat);
    let mut news = state.leaders.news.subscribe();
    let operations = serve_operations(connection.clone(), state.clone(), session);
    let control_ended = watch_control(recv, limits);
    tokio::pin!(operations, control_ended);
    let (why, stopping) = tokio::select! {
        why = &mut operations => (why, false),
        why = &mut control_ended => (why, false),
        _ = stop.wait_for(|s| *s) => (String::new(), true),
        newer = news.wait_for(|n| n.epoch > epoch) => {
            let newer = newer
                .map(|n| format!("a newer leader (epoch {}) at {}", n.epoch, n.addr.clone().unwrap_or_default()))
                .unwrap_or_default();
            return Err(WorkerError::NewLeader(leave(state, &connection, options, newer)));
        }
    };
    if stopping {
        // Both session futures are still running (only the stop ended the
        // select), so the drain may wait on them.
        let session_ended = async {
            tokio::select! {
                _ = operations => {}
                _ = control_ended => {}
            }
        };
        drain(&control, state, options.drain_timeout, session_ended).await;
    }
    if *stop.borrow() {
        tessera_net::CloseCode::Shutdown.close(&connection, "shutdown");
        return Ok(());
    }
    // Why, before this side closes it too (then it reads "closed").
    let why = connection
        .close_reason()
        .map(|r| r.to_string())
        .unwrap_or(why);
    Err(WorkerError::CoordinatorLost(leave(
        state,
        &connection,
        options,
        why,
    )))
}

/// Stopping with deployments here: asks the coordinator to move them
/// (`Draining`) and keeps serving what they hold until it has (it then
/// closes the session: `session_ended`), at most `limit`.
async fn drain(
    control: &Link,
    state: &State,
    limit: Duration,
    session_ended: impl std::future::Future<Output = ()>,
) {
    let held = state.router.deployments.networks().len();
    if held == 0 || limit.is_zero() {
        return;
    }
    tracing::info!(
        deployments = held,
        limit_s = limit.as_secs_f64(),
        "draining: serving what runs here while the coordinator moves it elsewhere"
    );
    let started = Instant::now();
    if control.send_control(&WorkerReport::Draining).await.is_err() {
        return;
    }
    tokio::select! {
        () = session_ended => tracing::info!(
            took_ms = started.elapsed().as_millis() as u64,
            "drained: the coordinator moved what ran here"
        ),
        () = tokio::time::sleep(limit) => tracing::warn!(
            "drain: not done within {limit:?}; stopping what still runs here"
        ),
    }
}

/// Ends a session with a coordinator that is gone (or no longer leads):
/// what is deployed here is orphaned until one adopts it; returns `why`.
fn leave(
    state: &State,
    connection: &quinn::Connection,
    options: &WorkerOptions,
    why: String,
) -> String {
    state.orphaned();
    let held = state.router.deployments.networks().len();
    if held > 0 {
        tracing::warn!(
            deployments = held,
            grace_s = options.adopt_grace.as_secs_f64(),
            "the coordinator is gone: serving what is deployed here until one adopts it"
        );
    }
    tessera_net::CloseCode::SessionOver.close(connection, "session over");
    why
}

/// Unloads the deployments held here that the coordinator did not adopt
/// (it does not serve them: it re-planned them elsewhere, or it does not
/// know them).
async fn unload_unadopted(router: &Router, adopted: &[u64], epoch: u64) {
    let dropped: Vec<u64> = router
        .deployments
        .networks()
        .into_iter()
        .filter(|d| !adopted.contains(d))
        .collect();
    if !adopted.is_empty() {
        tracing::info!(epoch, deployments = ?adopted, "the coordinator adopted what is deployed here");
    }
    for deployment in dropped {
        tracing::info!(
            deployment,
            epoch,
            "unloading a deployment the coordinator did not adopt"
        );
        stop_all(router.remove(deployment)).await;
    }
}

/// Whether deployments held since `orphaned` (when the coordinator was
/// lost; none: one adopted them) are due to be unloaded at `now`.
pub(super) fn orphans_due(orphaned: Option<Instant>, now: Instant, grace: Duration) -> bool {
    orphaned.is_some_and(|since| now.saturating_duration_since(since) >= grace)
}

/// Unloads everything deployed here once no coordinator has adopted it
/// for `grace` (checked every second, or sooner for a short grace).
pub(super) async fn unload_orphans(state: Arc<State>, grace: Duration) {
    let every = (grace / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        let due = orphans_due(state.orphaned_since(), Instant::now(), grace);
        if due && !state.router.deployments.networks().is_empty() {
            tracing::warn!(
                grace_s = grace.as_secs_f64(),
                "no coordinator adopted what is deployed here in time: unloading it"
            );
            stop_all(state.router.remove_all()).await;
            state.router.peers.close().await;
        }
    }
}

/// Registers with the leading coordinator: the one last named leader
/// first, then the others listed; a standby's answer names the leader,
/// tried next.
async fn register(
    options: &WorkerOptions,
    state: &State,
    infos: &[DeviceInfo],
) -> Result<Registered, WorkerError> {
    let mut order: std::collections::VecDeque<String> = state.leaders.order().into();
    let mut tried = Vec::new();
    let mut last = None;
    while let Some(addr) = order.pop_front() {
        if tried.contains(&addr) {
            continue;
        }
        tried.push(addr.clone());
        match register_at(options, state, infos, &addr).await {
            Ok(Attempt::Registered(r)) => return Ok(r),
            Ok(Attempt::Standby(Some(leader))) => order.push_front(leader),
            Ok(Attempt::Standby(None)) => {
                last = Some(WorkerError::NoLeader(format!(
                    "{addr} stands by, none leads"
                )))
            }
            Err(e @ WorkerError::Registration(_)) => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| WorkerError::NoLeader("no coordinator is listed".into())))
}

/// What one coordinator answered a registration.
enum Attempt {
    Registered(Registered),
    /// A standby: the leader's address, when one leads.
    Standby(Option<String>),
}

/// Dials `addr` and registers this worker's devices there.
async fn register_at(
    options: &WorkerOptions,
    state: &State,
    infos: &[DeviceInfo],
    addr: &str,
) -> Result<Attempt, WorkerError> {
    let node = &state.node;
    let coordinator = tessera_net::resolve(addr).await?;
    let dial = node.dial(coordinator);
    let dialled = if state.leaders.ha() {
        tokio::time::timeout(super::leader::DIAL_TIMEOUT, dial)
            .await
            .map_err(|_| WorkerError::NoLeader(format!("{addr} does not answer")))?
    } else {
        dial.await
    };
    let Peer {
        connection,
        mut send,
        mut recv,
        ..
    } = dialled?;
    let data_addr = match &options.advertise {
        Some(a) => a.clone(),
        None => advertised(node, &connection, coordinator)?,
    };
    let limits = *node.limits();
    let register = WorkerReport::Register {
        name: options.name.clone(),
        data_addr: data_addr.clone(),
        devices: infos.to_vec(),
        holds: state.router.deployments.holds(),
        sequences: state.router.sequences.loads(),
        compiles: state.router.telemetry.compile_counts(),
    };
    exchange::send_message(&mut send, &register, None, &limits).await?;
    let answer = exchange::answer::<CoordinatorAnswer>(&mut recv, &limits, |_| {}).await;
    let (heartbeat, adopted, epoch) = match answer {
        Ok(CoordinatorAnswer::Registered {
            heartbeat_ms,
            adopted,
            epoch,
        }) => (Duration::from_millis(heartbeat_ms.max(50)), adopted, epoch),
        Ok(CoordinatorAnswer::Standby { leader, .. }) => return Ok(Attempt::Standby(leader)),
        Ok(CoordinatorAnswer::Failed(refused)) => {
            return Err(WorkerError::Registration(refused.error))
        }
        Ok(other) => return Err(WorkerError::Registration(format!("answered {other:?}"))),
        Err(ExchangeError::Net(e)) => return Err(e.into()),
        Err(e) => return Err(WorkerError::Registration(e.to_string())),
    };
    if !state.leaders.registered(epoch) {
        let newest = state.leaders.newest();
        tracing::warn!(coordinator = %addr, epoch, newest, "refused a coordinator whose epoch is older than the newest leader's");
        tessera_net::CloseCode::SessionOver.close(&connection, "fenced: an older epoch");
        return Ok(Attempt::Standby(None));
    }
    tracing::info!(name = %options.name, coordinator = %addr, %data_addr, epoch, "registered with the coordinator");
    Ok(Attempt::Registered(Registered {
        connection,
        send,
        recv,
        data_addr,
        heartbeat,
        adopted,
        epoch,
    }))
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
                in_flight: router.telemetry.in_flight(),
                subgraphs: router.telemetry.subgraph_loads(),
                sequences: router.sequences.loads(),
                links: router.telemetry.link_rates(),
                rss_bytes: crate::memory::resident_bytes(),
                compiles: router.telemetry.compile_counts(),
            };
            if control.send_control(&beat).await.is_err() {
                break;
            }
        }
    });
}

/// Accepts the connections of requesters (clients, front doors, the
/// coordinator's front door) and other workers, for as long as the worker
/// runs (they outlive its sessions with the coordinator).
pub(super) async fn accept_peers(state: Arc<State>) {
    // Each connection handshakes on its own task (one slow peer holds up
    // no other).
    while let Some(connecting) = state.node.incoming().await {
        let state = state.clone();
        tokio::spawn(async move {
            let roles = [Role::Worker, Role::Client, Role::Coordinator];
            match state.node.handshake(connecting, &roles).await {
                Ok(peer) => {
                    tracing::debug!(peer = %peer.hello.node, role = ?peer.hello.role, "connected");
                    super::data::serve_connection(state, peer).await;
                }
                Err(e) => tracing::warn!("refused a peer: {e}"),
            }
        });
    }
}

/// Operations from the coordinator, one per stream, until the connection
/// ends; returns why.
async fn serve_operations(
    connection: quinn::Connection,
    state: Arc<State>,
    session: u64,
) -> String {
    loop {
        let (send, recv) = match connection.accept_bi().await {
            Ok(s) => s,
            Err(e) => return e.to_string(),
        };
        tokio::spawn(operations::serve_operation(
            state.clone(),
            session,
            send,
            recv,
        ));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_no_coordinator_adopted_is_unloaded_once_the_grace_is_over() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(300);
        // Adopted (or never orphaned): kept however long.
        assert!(!orphans_due(None, t0 + grace * 2, grace));
        assert!(!orphans_due(Some(t0), t0, grace));
        assert!(!orphans_due(
            Some(t0),
            t0 + grace - Duration::from_millis(1),
            grace
        ));
        assert!(orphans_due(Some(t0), t0 + grace, grace));
        // A clock read before the loss (a race) is not due.
        assert!(!orphans_due(Some(t0 + grace), t0, grace));
    }
}
