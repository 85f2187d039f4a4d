//! Cluster membership: a worker registers on its connection's control
//! stream, then sends heartbeats there with what its deployments did and
//! hold (aggregated: no request passes through the coordinator). A worker
//! whose connection closes, or that stays silent longer than
//! `worker_timeout_ms`, is dropped and the networks on it heal; requesters
//! learn it from the routing tables.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_common::wire::cluster::{CoordinatorAnswer, WorkerReport};
use tessera_common::wire::control::{ErrorKind, SubgraphLoad};
use tessera_common::wire::Frame;
use tessera_net::{exchange, recv_frame, Peer};

use crate::workers::WorkerEntry;
use crate::Shared;

/// A connection with a worker's certificate: the worker itself, which
/// registers on the handshake's stream at once, or a front door on that
/// worker, a requester that opens operation streams as a client does.
pub async fn serve_worker_or_client(shared: Arc<Shared>, peer: Peer) {
    let limits = *shared.node.limits();
    let Peer {
        connection,
        hello,
        mut send,
        mut recv,
    } = peer;
    let first = tokio::select! {
        first = exchange::read_operation::<WorkerReport>(&mut recv, &limits) => first,
        stream = connection.accept_bi() => {
            if let Ok(stream) = stream {
                crate::clients::serve_streams(shared, connection, hello.node, Some(stream)).await;
            }
            return;
        }
    };
    if let Ok(Some((WorkerReport::WatchLeader { .. }, _))) = &first {
        return crate::ha::watch_leader(shared, connection, send).await;
    }
    if !shared.leads() {
        // A standby: the worker goes to the leader.
        let standby = shared.leader.borrow().answer();
        let _ = exchange::send_message(&mut send, &standby, None, &limits).await;
        let _ = send.finish();
        return;
    }
    let Some(entry) = register(&shared, &connection, &hello.node, &mut send, first).await else {
        return;
    };
    serve_worker(shared, connection, entry, recv).await;
}

/// One worker's session, from registration until it is lost.
async fn serve_worker(
    shared: Arc<Shared>,
    connection: quinn::Connection,
    entry: Arc<WorkerEntry>,
    recv: quinn::RecvStream,
) {
    let why = read_control(&shared, &entry, recv).await;
    let why = connection
        .close_reason()
        .map(|r| r.to_string())
        .unwrap_or(why);
    tessera_net::CloseCode::Dropped.close(&connection, "dropped");
    // Only if this session's entry is still the registered one (not a
    // newer registration under the same name).
    let ours = shared
        .workers
        .get(&entry.name)
        .is_some_and(|w| w.connection.stable_id() == connection.stable_id());
    if ours {
        lost(&shared, &entry.name, &why);
    }
}

/// Takes the worker's `Register` (`first`, under its certificate's name
/// only), answers `Registered` and adds it to the members; `None` if it
/// did not register.
async fn register(
    shared: &Arc<Shared>,
    connection: &quinn::Connection,
    name: &str,
    send: &mut quinn::SendStream,
    first: Result<Option<(WorkerReport, bytes::Bytes)>, tessera_net::ExchangeError>,
) -> Option<Arc<WorkerEntry>> {
    let limits = *shared.node.limits();
    let (data_addr, devices, holds, sequences, compiles) = match first {
        Ok(Some((
            WorkerReport::Register {
                name: claimed,
                data_addr,
                devices,
                holds,
                sequences,
                compiles,
            },
            _,
        ))) if claimed == name => (data_addr, devices, holds, sequences, compiles),
        Ok(Some((WorkerReport::Register { name: claimed, .. }, _))) => {
            let why = format!("registered as '{claimed}' with the certificate of '{name}'");
            refuse(send, why, &limits).await;
            return None;
        }
        other => {
            tracing::warn!(worker = %name, "expected Register, got {other:?}");
            return None;
        }
    };
    if let Some(old) = shared.workers.get(name).map(|w| w.connection.clone()) {
        // The same certificate again: the worker restarted (or reconnected
        // after a network cut) before its loss was noticed.
        lost(shared, name, "it registered again");
        tessera_net::CloseCode::RegisteredAgain.close(&old, "registered again");
    }
    let crate::state::restore::Adoption { adopted, lacking } =
        crate::state::restore::adoption(shared, name, &holds);
    let registered = CoordinatorAnswer::Registered {
        heartbeat_ms: shared.config.heartbeat_ms,
        adopted: adopted.clone(),
        epoch: shared.state.epoch(),
    };
    exchange::send_message(send, &registered, None, &limits)
        .await
        .ok()?;
    let entry = Arc::new(WorkerEntry {
        name: name.to_string(),
        data_addr,
        devices,
        connection: connection.clone(),
        last_seen: Mutex::new(Instant::now()),
        bandwidth: Mutex::new(None),
        reported: Default::default(),
        running: Default::default(),
        rss_bytes: Default::default(),
        compiles: Mutex::new(compiles),
        epoch: shared.state.epoch(),
        draining: Default::default(),
        answers: Default::default(),
        round_trips: Default::default(),
    });
    entry.heard(Vec::new(), sequences, Vec::new(), Instant::now());
    let kinds: Vec<&str> = entry.devices.iter().map(|d| d.device.as_str()).collect();
    tracing::info!(worker = %name, addr = %entry.data_addr, devices = %kinds.join(","), "worker registered");
    if !adopted.is_empty() {
        tracing::info!(worker = %name, deployments = ?adopted, "adopted what the worker still serves");
    }
    shared.workers.insert(name.to_string(), entry.clone());
    shared.metrics.worker_up(name, true);
    shared.repository.changed();
    for (loaded, replica) in lacking {
        let why = format!("worker {name} registered again without its subgraphs");
        crate::heal::replan(shared, loaded, replica, why);
    }
    crate::heal::worker_joined(shared, name);
    Some(entry)
}

/// The worker's control stream: its heartbeats, until it ends; returns
/// why.
async fn read_control(
    shared: &Arc<Shared>,
    entry: &WorkerEntry,
    mut recv: quinn::RecvStream,
) -> String {
    let limits = *shared.node.limits();
    loop {
        let report = match recv_frame::<WorkerReport>(&mut recv, &limits).await {
            Ok(Some(Frame::Control(report, _))) => report,
            Ok(Some(other)) => {
                return format!("unexpected {:?} frame on its control stream", other.kind())
            }
            Ok(None) => return "it closed its control stream".to_string(),
            Err(e) => return e.to_string(),
        };
        if let Ok(mut seen) = entry.last_seen.lock() {
            *seen = Instant::now();
        }
        on_report(shared, &entry.name, report);
    }
}

/// What a registered worker reports on its control stream.
fn on_report(shared: &Arc<Shared>, worker: &str, report: WorkerReport) {
    match report {
        WorkerReport::Heartbeat {
            in_flight,
            subgraphs,
            sequences,
            links,
            rss_bytes,
            compiles,
            ..
        } => {
            let Some(entry) = shared.workers.get(worker).map(|e| e.clone()) else {
                return;
            };
            if let Ok(mut c) = entry.compiles.lock() {
                *c = compiles;
            }
            entry.running.store(in_flight, Ordering::Relaxed);
            entry.rss_bytes.store(rss_bytes, Ordering::Relaxed);
            load_metrics(shared, worker, &subgraphs);
            entry.heard(subgraphs, sequences, links, Instant::now());
        }
        WorkerReport::Draining => crate::drain::worker_draining(shared, worker),
        WorkerReport::Register { name, .. } | WorkerReport::WatchLeader { name } => {
            tracing::warn!(%worker, "'{name}' registered or watched again on an open session; ignored")
        }
    }
}

/// Drops a worker: the networks on it start healing (their routing tables
/// say so, and requesters retry on the healed copies).
pub fn lost(shared: &Arc<Shared>, name: &str, why: &str) {
    let Some((_, entry)) = shared.workers.remove(name) else {
        return;
    };
    shared.metrics.worker_up(name, false);
    shared.repository.changed();
    if !shared.shutting_down() {
        crate::heal::worker_lost(shared, name);
    }
    if shared.shutting_down() {
        tracing::debug!(worker = %name, "worker disconnected at shutdown: {why}");
    } else if entry.draining() {
        tracing::info!(worker = %name, "worker left after draining: {why}");
    } else {
        tracing::warn!(worker = %name, "worker lost: {why}");
    }
}

/// A heartbeat's subgraph loads (depths and counters), by the model each
/// deployment serves.
fn load_metrics(shared: &Shared, worker: &str, loads: &[SubgraphLoad]) {
    let model_of = |deployment: u64| {
        shared
            .networks
            .iter()
            .find(|n| n.serves(deployment))
            .map(|n| n.name.clone())
    };
    let by_model = loads
        .iter()
        .filter_map(|l| Some((model_of(l.network)?, l.clone())))
        .collect();
    shared.metrics.subgraph_loads(worker, by_model);
}

async fn refuse(
    send: &mut quinn::SendStream,
    error: String,
    limits: &tessera_common::wire::Limits,
) {
    tracing::warn!("refusing a worker: {error}");
    if exchange::send_failure::<CoordinatorAnswer>(send, ErrorKind::Refused, error, limits)
        .await
        .is_ok()
    {
        let _ = send.finish();
        let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
    }
}

/// Drops workers silent for longer than `worker_timeout_ms`. A tick that
/// comes far later than asked (the coordinator itself was paused: SIGSTOP,
/// a stalled VM) first gives every worker a fresh heartbeat's time: the
/// silence was the coordinator's.
pub async fn watchdog(shared: Arc<Shared>) {
    let timeout = Duration::from_millis(shared.config.worker_timeout_ms);
    let every = Duration::from_millis(shared.config.heartbeat_ms);
    let mut last = Instant::now();
    loop {
        tokio::time::sleep(every).await;
        let now = Instant::now();
        if paused(now.duration_since(last), every, timeout) {
            tracing::warn!(
                "the coordinator was paused for {:?}: giving the workers time to be heard",
                now.duration_since(last)
            );
            for w in shared.workers.iter() {
                if let Ok(mut seen) = w.last_seen.lock() {
                    *seen = now;
                }
            }
        }
        last = now;
        let silent: Vec<Arc<WorkerEntry>> = shared
            .workers
            .iter()
            .filter(|w| {
                w.last_seen
                    .lock()
                    .map(|seen| seen.elapsed() > timeout)
                    .unwrap_or(false)
            })
            .map(|w| w.value().clone())
            .collect();
        for w in silent {
            let why = format!("no heartbeat for {} ms", timeout.as_millis());
            let current = shared
                .workers
                .get(&w.name)
                .is_some_and(|c| c.connection.stable_id() == w.connection.stable_id());
            if current {
                lost(&shared, &w.name, &why);
            }
            tessera_net::CloseCode::Silent.close(&w.connection, &why);
        }
    }
}

/// Whether a watchdog tick `took` after one asked `every` apart means the
/// coordinator was paused (more than half the worker timeout late).
fn paused(took: Duration, every: Duration, timeout: Duration) -> bool {
    took > every + timeout / 2
}

#[cfg(test)]
mod tests {
    use super::paused;
    use std::time::Duration;

    #[test]
    fn a_late_tick_is_the_coordinators_pause_not_the_workers_silence() {
        let (every, timeout) = (Duration::from_millis(500), Duration::from_millis(2000));
        assert!(!paused(Duration::from_millis(700), every, timeout));
        assert!(paused(Duration::from_millis(3000), every, timeout));
    }
}
