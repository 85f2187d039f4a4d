//! Cluster membership: a worker registers on its connection's control
//! stream, then sends heartbeats (with its actors' mailbox depths) and
//! request failures there; its final outputs, per-subgraph timings (`Ran`)
//! and tensor transfers (`Moved`) arrive on unidirectional data streams. A worker
//! whose connection closes, or that stays silent longer than
//! `worker_timeout_ms`, is dropped, and every request waiting on it fails
//! with an error that names it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_common::onnx::ElemType;
use tessera_common::tensor::Tensor;
use tessera_common::wire::control::{Control, DeviceInfo, MailboxDepth};
use tessera_common::wire::Frame;
use tessera_net::{recv_frame, send_frame, serve_streams, Link, Peer};

use crate::requests::Failure;
use crate::Shared;

/// A registered worker.
pub struct WorkerEntry {
    pub name: String,
    /// Where other workers stream to it.
    pub data_addr: String,
    pub devices: Vec<DeviceInfo>,
    pub connection: quinn::Connection,
    /// Graph inputs to this worker.
    pub tensors: Link,
    pub last_seen: Mutex<Instant>,
    /// Link bandwidth to it, GB/s, measured on a probe at registration and
    /// then on every large tensor it receives (moving average).
    bandwidth: Mutex<Option<f64>>,
    /// Subgraph runs under way, from its last heartbeat.
    pub running: std::sync::atomic::AtomicU32,
}

/// Tensors at least this large update a link's bandwidth estimate.
const MEASURED_BYTES: u64 = 256 << 10;

/// The probe sent to each worker at registration.
pub const PROBE_BYTES: usize = 4 << 20;

impl WorkerEntry {
    pub fn rtt(&self) -> Duration {
        self.connection.rtt()
    }

    /// The measured bandwidth to this worker, if any yet (GB/s).
    pub fn bandwidth_gbps(&self) -> Option<f64> {
        self.bandwidth.lock().ok().and_then(|b| *b)
    }

    /// Folds a received tensor of `bytes` that took `micros` into the
    /// estimate.
    pub fn observe(&self, bytes: u64, micros: u64) {
        if bytes < MEASURED_BYTES || micros == 0 {
            return;
        }
        let gbps = bytes as f64 / micros as f64 / 1e3;
        if let Ok(mut b) = self.bandwidth.lock() {
            *b = Some(match *b {
                Some(old) => 0.8 * old + 0.2 * gbps,
                None => gbps,
            });
        }
    }
}

/// One worker's session, from registration until it is lost.
pub async fn serve_worker(shared: Arc<Shared>, peer: Peer) {
    let Peer {
        connection,
        hello,
        mut send,
        mut recv,
    } = peer;
    let limits = *shared.node.limits();
    let name = hello.node.clone();
    let (data_addr, devices) = match recv_frame(&mut recv, &limits).await {
        Ok(Some(Frame::Control(
            Control::Register {
                name: claimed,
                data_addr,
                devices,
            },
            _,
        ))) if claimed == name => (data_addr, devices),
        Ok(Some(Frame::Control(Control::Register { name: claimed, .. }, _))) => {
            refuse(
                &mut send,
                format!("registered as '{claimed}' with the certificate of '{name}'"),
                &limits,
            )
            .await;
            return;
        }
        other => {
            tracing::warn!(worker = %name, "expected Register, got {other:?}");
            return;
        }
    };
    if let Some(old) = shared.workers.get(&name).map(|w| w.connection.clone()) {
        // The same certificate again: the worker restarted (or reconnected
        // after a network cut) before its loss was noticed.
        lost(&shared, &name, "it registered again");
        tessera_net::CloseCode::RegisteredAgain.close(&old, "registered again");
    }
    let registered = Control::Registered {
        heartbeat_ms: shared.config.heartbeat_ms,
    };
    let Ok(head) = registered.encode(0, &limits) else {
        return;
    };
    if send_frame(&mut send, &head, None).await.is_err() {
        return;
    }
    let entry = Arc::new(WorkerEntry {
        name: name.clone(),
        data_addr,
        devices,
        tensors: Link::open(connection.clone(), &name, limits, 64),
        connection: connection.clone(),
        last_seen: Mutex::new(Instant::now()),
        bandwidth: Mutex::new(None),
        running: Default::default(),
    });
    let kinds: Vec<&str> = entry.devices.iter().map(|d| d.device.as_str()).collect();
    tracing::info!(worker = %name, addr = %entry.data_addr, devices = %kinds.join(","), "worker registered");
    shared.workers.insert(name.clone(), entry.clone());
    shared.metrics.worker_up(&name, true);
    crate::heal::worker_joined(&shared, &name);
    // A probe tensor (network 0): the worker reports how long it took.
    let probe = entry.tensors.clone();
    tokio::spawn(async move {
        let zeros = vec![0u8; PROBE_BYTES];
        if let Ok(t) = Tensor::new(ElemType::UINT8, vec![PROBE_BYTES], zeros) {
            let _ = probe.send_tensor(0, 0, "probe", &t).await;
        }
    });

    // Data streams: final outputs, timings (`Ran`), transfers (`Moved`).
    let outputs = {
        let shared = shared.clone();
        let from: Arc<str> = name.as_str().into();
        serve_streams(connection.clone(), limits, move |frame, took| {
            let (shared, from) = (shared.clone(), from.clone());
            async move {
                match frame {
                    Frame::Tensor(header, payload) => {
                        crate::requests::output_arrived(&shared, &from, header, payload, took)
                    }
                    Frame::Control(
                        Control::Ran {
                            request,
                            subgraph,
                            micros,
                            nodes,
                        },
                        _,
                    ) => crate::requests::ran(&shared, request, subgraph, micros, nodes),
                    Frame::Control(Control::Moved(transfer), _) => {
                        if let Some(w) = shared.workers.get(&transfer.to) {
                            w.observe(transfer.bytes, transfer.micros);
                        }
                        crate::requests::moved(&shared, transfer)
                    }
                    other => tracing::warn!("unexpected {:?} frame on a data stream", other.kind()),
                }
            }
        })
    };
    // Control stream: heartbeats, failures.
    let control = {
        let shared = shared.clone();
        let entry = entry.clone();
        async move {
            loop {
                match recv_frame(&mut recv, &limits).await {
                    Ok(Some(Frame::Control(msg, _))) => {
                        if let Ok(mut seen) = entry.last_seen.lock() {
                            *seen = Instant::now();
                        }
                        match msg {
                            Control::Heartbeat {
                                in_flight,
                                mailboxes,
                                ..
                            } => {
                                entry
                                    .running
                                    .store(in_flight, std::sync::atomic::Ordering::Relaxed);
                                mailbox_metrics(&shared, &entry.name, mailboxes);
                            }
                            Control::Failed {
                                request: Some(request),
                                error,
                            } => crate::requests::fail(&shared, request, Failure::Error(error)),
                            Control::Unreachable { request, error } => {
                                crate::requests::fail(&shared, request, Failure::Unreachable(error))
                            }
                            other => {
                                tracing::warn!(worker = %entry.name, "unexpected {}", other.name())
                            }
                        }
                    }
                    Ok(Some(other)) => {
                        return format!("unexpected {:?} frame on its control stream", other.kind())
                    }
                    Ok(None) => return "it closed its control stream".to_string(),
                    Err(e) => return e.to_string(),
                }
            }
        }
    };
    let why = tokio::select! {
        why = outputs => why,
        why = control => why,
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
        .get(&name)
        .is_some_and(|w| w.connection.stable_id() == connection.stable_id());
    if ours {
        lost(&shared, &name, &why);
    }
}

/// Drops a worker: the networks on it start healing, then the requests
/// that wait on it fail (and are retried on the healed networks).
pub fn lost(shared: &Arc<Shared>, name: &str, why: &str) {
    if shared.workers.remove(name).is_none() {
        return;
    }
    shared.metrics.worker_up(name, false);
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
            .find(|n| n.deployed().is_some_and(|d| d.id == deployment))
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
    let msg = Control::Failed {
        request: None,
        error,
    };
    if let Ok(head) = msg.encode(0, limits) {
        let _ = send_frame(send, &head, None).await;
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
