//! Cluster membership: a worker registers on its connection's control
//! stream, then sends heartbeats (with its actors' mailbox depths) and
//! request failures there; its final outputs, per-subgraph timings (`Ran`)
//! and tensor transfers (`Moved`) arrive on unidirectional data streams. A worker
//! whose connection closes, or that stays silent longer than
//! `worker_timeout_ms`, is dropped, and every request waiting on it fails
//! with an error that names it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_common::onnx::ElemType;
use tessera_common::tensor::Tensor;
use tessera_common::wire::cluster::{CoordinatorAnswer, WorkerReport};
use tessera_common::wire::control::{ErrorKind, MailboxDepth};
use tessera_common::wire::{Failure, Frame};
use tessera_net::{exchange, recv_frame, serve_streams, Link, Peer};

use crate::requests::Outcome;
use crate::workers::{WorkerEntry, PROBE_BYTES};
use crate::Shared;

/// One worker's session, from registration until it is lost.
pub async fn serve_worker(shared: Arc<Shared>, peer: Peer) {
    let Peer {
        connection,
        hello,
        mut send,
        mut recv,
    } = peer;
    let Some(entry) = register(&shared, &connection, &hello.node, &mut send, &mut recv).await
    else {
        return;
    };
    let limits = *shared.node.limits();
    let why = tokio::select! {
        why = serve_streams(connection.clone(), limits, data_handler(&shared, &entry.name)) => why,
        why = read_control(&shared, &entry, recv) => why,
    };
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

/// Reads the worker's `Register` (under its certificate's name only),
/// answers `Registered` and adds it to the members; `None` if it did not
/// register.
async fn register(
    shared: &Arc<Shared>,
    connection: &quinn::Connection,
    name: &str,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
) -> Option<Arc<WorkerEntry>> {
    let limits = *shared.node.limits();
    let (data_addr, devices) = match exchange::read_operation::<WorkerReport>(recv, &limits).await {
        Ok(Some((
            WorkerReport::Register {
                name: claimed,
                data_addr,
                devices,
            },
            _,
        ))) if claimed == name => (data_addr, devices),
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
    let registered = CoordinatorAnswer::Registered {
        heartbeat_ms: shared.config.heartbeat_ms,
    };
    exchange::send_message(send, &registered, None, &limits)
        .await
        .ok()?;
    let entry = Arc::new(WorkerEntry {
        name: name.to_string(),
        data_addr,
        devices,
        tensors: Link::open(connection.clone(), name, limits, 64),
        connection: connection.clone(),
        last_seen: Mutex::new(Instant::now()),
        bandwidth: Mutex::new(None),
        running: Default::default(),
        rss_bytes: Default::default(),
    });
    let kinds: Vec<&str> = entry.devices.iter().map(|d| d.device.as_str()).collect();
    tracing::info!(worker = %name, addr = %entry.data_addr, devices = %kinds.join(","), "worker registered");
    shared.workers.insert(name.to_string(), entry.clone());
    shared.metrics.worker_up(name, true);
    shared.repository.changed();
    crate::heal::worker_joined(shared, name);
    // A probe tensor (network 0): the worker reports how long it took.
    let probe = entry.tensors.clone();
    tokio::spawn(async move {
        let zeros = vec![0u8; PROBE_BYTES];
        if let Ok(t) = Tensor::new(ElemType::UINT8, vec![PROBE_BYTES], zeros) {
            let _ = probe.send_tensor(0, 0, "probe", &t).await;
        }
    });
    Some(entry)
}

/// The worker's data streams: final outputs, and its reports (timings and
/// transfers travel there, ordered with the outputs they concern).
fn data_handler(
    shared: &Arc<Shared>,
    from: &str,
) -> impl Fn(
    Frame<WorkerReport>,
    Duration,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
       + Clone
       + Send
       + Sync
       + 'static {
    let (shared, from): (Arc<Shared>, Arc<str>) = (shared.clone(), from.into());
    move |frame, took| {
        let (shared, from) = (shared.clone(), from.clone());
        Box::pin(async move {
            match frame {
                Frame::Tensor(header, payload) => {
                    crate::requests::output_arrived(&shared, &from, header, payload, took)
                }
                Frame::Control(report, _) => on_report(&shared, &from, report),
                Frame::Handshake(_) => {
                    tracing::warn!(worker = %from, "a handshake on a data stream")
                }
            }
        })
    }
}

/// The worker's control stream: heartbeats and request failures, until it
/// ends; returns why.
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

/// What a registered worker reports, on whichever of its streams.
fn on_report(shared: &Arc<Shared>, worker: &str, report: WorkerReport) {
    match report {
        WorkerReport::Heartbeat {
            in_flight,
            mailboxes,
            rss_bytes,
            ..
        } => {
            if let Some(entry) = shared.workers.get(worker) {
                entry.running.store(in_flight, Ordering::Relaxed);
                entry.rss_bytes.store(rss_bytes, Ordering::Relaxed);
            }
            mailbox_metrics(shared, worker, mailboxes);
        }
        WorkerReport::Ran {
            request,
            subgraph,
            micros,
            nodes,
        } => crate::requests::ran(shared, request, subgraph, micros, nodes),
        WorkerReport::Moved(transfer) => {
            if let Some(w) = shared.workers.get(&transfer.to) {
                w.observe(transfer.bytes, transfer.micros);
            }
            crate::requests::moved(shared, transfer)
        }
        WorkerReport::Failed(Failure {
            request: Some(request),
            error,
            ..
        }) => crate::requests::fail(shared, request, Outcome::Error(error)),
        WorkerReport::Failed(Failure {
            request: None,
            error,
            ..
        }) => tracing::warn!(%worker, "worker failure: {error}"),
        WorkerReport::Unreachable { request, error } => {
            crate::requests::fail(shared, request, Outcome::Unreachable(error))
        }
        WorkerReport::Register { name, .. } => {
            tracing::warn!(%worker, "registered again as '{name}' on an open session; ignored")
        }
    }
}

/// Drops a worker: the networks on it start healing, then the requests
/// that wait on it fail (and are retried on the healed networks).
pub fn lost(shared: &Arc<Shared>, name: &str, why: &str) {
    if shared.workers.remove(name).is_none() {
        return;
    }
    shared.metrics.worker_up(name, false);
    shared.repository.changed();
    if !shared.shutting_down() {
        crate::heal::worker_lost(shared, name);
    }
    if shared.shutting_down() {
        tracing::debug!(worker = %name, "worker disconnected at shutdown: {why}");
    } else {
        tracing::warn!(worker = %name, "worker lost: {why}");
    }
    crate::requests::fail_on_worker(shared, name, &format!("worker {name} was lost: {why}"));
}

/// A heartbeat's mailbox depths, by the model each deployment serves.
fn mailbox_metrics(shared: &Shared, worker: &str, mailboxes: Vec<MailboxDepth>) {
    let model_of = |deployment: u64| {
        shared
            .networks
            .iter()
            .find(|n| n.serves(deployment))
            .map(|n| n.name.clone())
    };
    let depths = mailboxes
        .into_iter()
        .filter_map(|m| Some((model_of(m.network)?, m.subgraph, m.depth)))
        .collect();
    shared.metrics.mailboxes(worker, depths);
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

/// Drops workers silent for longer than `worker_timeout_ms`.
pub async fn watchdog(shared: Arc<Shared>) {
    let timeout = Duration::from_millis(shared.config.worker_timeout_ms);
    let every = Duration::from_millis(shared.config.heartbeat_ms);
    loop {
        tokio::time::sleep(every).await;
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
