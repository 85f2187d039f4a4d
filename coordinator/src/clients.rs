//! Client sessions: a client opens one bidirectional stream per operation
//! (`LoadNetwork`, also as a dry run, `Infer`, `Unload`, `QueryNetwork`,
//! `ClusterInfo`, and for named models `LoadModel`, `UnloadModel`,
//! `ListModels`); many run at once. A malformed
//! operation fails on its own stream; the session and the others go on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tessera_common::wire::control::{Control, WorkerState};
use tessera_common::wire::tensor::TensorHeader;
use tessera_common::wire::{Frame, Limits};
use tessera_net::{recv_frame, send_frame, Peer};
use tokio::sync::mpsc;

use crate::{load, requests, CoordinatorError, Shared};

/// Serves one client until it disconnects.
pub async fn serve_client(shared: Arc<Shared>, peer: Peer) {
    let client = peer.hello.node.clone();
    tracing::debug!(%client, "client connected");
    loop {
        let (send, recv) = match peer.connection.accept_bi().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(%client, "client gone: {e}");
                return;
            }
        };
        tokio::spawn(serve_operation(shared.clone(), send, recv));
    }
}

async fn serve_operation(
    shared: Arc<Shared>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let limits = *shared.node.limits();
    let result = match recv_frame(&mut recv, &limits).await {
        Ok(Some(Frame::Control(msg, payload))) => {
            operation(&shared, msg, payload, &mut send, &mut recv).await
        }
        Ok(Some(other)) => Err(format!(
            "expected an operation, got a {:?} frame",
            other.kind()
        )),
        Ok(None) => return,
        Err(e) => Err(e.to_string()),
    };
    if let Err(error) = result {
        tracing::debug!("client operation failed: {error}");
        let msg = Control::Failed {
            request: None,
            error,
        };
        if let Ok(head) = msg.encode(0, &limits) {
            let _ = send_frame(&mut send, &head, None).await;
        }
    }
    let _ = send.finish();
}

async fn operation(
    shared: &Arc<Shared>,
    msg: Control,
    payload: bytes::Bytes,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
) -> Result<(), String> {
    let limits = *shared.node.limits();
    match msg {
        Control::LoadNetwork(request) if request.dry_run => {
            let (tx, rx) = mpsc::channel::<Control>(64);
            let plan = with_progress(
                load::dry_run(shared, request, payload, tx),
                rx,
                send,
                &limits,
            )
            .await?;
            write(send, &Control::NetworkLoaded { network: 0, plan }, &limits).await
        }
        Control::LoadNetwork(request) => {
            let (tx, rx) = mpsc::channel::<Control>(64);
            let loaded = with_progress(
                load::load_network(shared, request, payload, tx),
                rx,
                send,
                &limits,
            )
            .await?;
            write(send, &network_loaded(&loaded), &limits).await
        }
        Control::LoadModel { name, request } => {
            let new = request.map(|r| (crate::repository::Source::Bytes(payload), r));
            let (tx, rx) = mpsc::channel::<Control>(64);
            let loaded = with_progress(
                crate::repository::load(shared, &name, new, tx),
                rx,
                send,
                &limits,
            )
            .await?;
            write(send, &network_loaded(&loaded), &limits).await
        }
        Control::UnloadModel { name } => {
            crate::repository::unload(shared, &name)
                .await
                .map_err(|e| e.to_string())?;
            write(send, &Control::ModelUnloaded { name }, &limits).await
        }
        Control::ListModels => {
            let models = crate::repository::statuses(shared);
            write(send, &Control::Models { models }, &limits).await
        }
        Control::QueryNetwork { devices } => {
            let (tx, rx) = mpsc::channel::<Control>(64);
            let spec = devices.join(",");
            let answers =
                with_progress(load::query(shared, &spec, payload, tx), rx, send, &limits).await?;
            write(send, &Control::QueryResult { answers }, &limits).await
        }
        Control::ClusterInfo => {
            let mut workers: Vec<WorkerState> = shared
                .workers
                .iter()
                .map(|w| WorkerState {
                    name: w.name.clone(),
                    data_addr: w.data_addr.clone(),
                    devices: w.devices.clone(),
                    silent_ms: w
                        .last_seen
                        .lock()
                        .map(|t| t.elapsed().as_millis() as u64)
                        .unwrap_or(0),
                    rtt_us: w.rtt().as_micros() as u64,
                    bandwidth_gbps: w.bandwidth_gbps().unwrap_or(0.0),
                    running: w.running.load(std::sync::atomic::Ordering::Relaxed),
                    networks: shared
                        .networks
                        .iter()
                        .filter(|n| n.deployed().is_some_and(|d| d.hosts.contains(&w.name)))
                        .map(|n| n.id)
                        .collect(),
                })
                .collect();
            workers.sort_by(|a, b| a.name.cmp(&b.name));
            let msg = Control::ClusterState {
                workers,
                networks: shared.networks.len() as u32,
                in_flight: shared.pending.len() as u32,
            };
            write(send, &msg, &limits).await
        }
        Control::Infer {
            network,
            request,
            inputs,
            deadline_ms,
        } => {
            let mut tensors = HashMap::new();
            for _ in 0..inputs {
                match recv_frame(recv, &limits).await {
                    Ok(Some(Frame::Tensor(header, payload))) => {
                        let name = header.name.clone();
                        let t = header.into_tensor(payload).map_err(|e| e.to_string())?;
                        tensors.insert(name, t);
                    }
                    Ok(other) => {
                        return Err(format!(
                            "request {request}: expected {inputs} input tensors, got {other:?}"
                        ))
                    }
                    Err(e) => return Err(format!("request {request}: {e}")),
                }
            }
            let deadline = (deadline_ms > 0).then(|| Duration::from_millis(deadline_ms));
            let done = requests::infer(shared, network, tensors, deadline)
                .await
                .map_err(|e: CoordinatorError| e.to_string())?;
            let reply = Control::InferDone {
                network,
                request,
                outputs: done.outputs.len() as u32,
                counters: done.counters,
                deployment: done.deployment,
                attempts: done.attempts,
            };
            write(send, &reply, &limits).await?;
            for (name, t) in &done.outputs {
                let head = TensorHeader::new(network, request, name, t)
                    .encode(&limits)
                    .map_err(|e| e.to_string())?;
                send_frame(send, &head, Some(&t.shared_bytes()))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        Control::Unload { network } => {
            load::unload(shared, network)
                .await
                .map_err(|e| e.to_string())?;
            write(send, &Control::Unloaded { network }, &limits).await
        }
        other => Err(format!("a client may not send {}", other.name())),
    }
}

/// The answer to a load: the network's id and its current plan.
fn network_loaded(loaded: &crate::heal::Loaded) -> Control {
    Control::NetworkLoaded {
        network: loaded.id,
        plan: loaded
            .deployed()
            .map(|d| d.plan.clone())
            .unwrap_or_default(),
    }
}

/// Runs `work`, forwarding the progress it reports to the client.
async fn with_progress<T>(
    work: impl std::future::Future<Output = Result<T, CoordinatorError>>,
    mut progress: mpsc::Receiver<Control>,
    send: &mut quinn::SendStream,
    limits: &Limits,
) -> Result<T, String> {
    tokio::pin!(work);
    loop {
        tokio::select! {
            result = &mut work => {
                // What was reported just before the end still goes out.
                while let Ok(p) = progress.try_recv() {
                    write(send, &p, limits).await?;
                }
                return result.map_err(|e| e.to_string());
            }
            Some(p) = progress.recv() => write(send, &p, limits).await?,
        }
    }
}

async fn write(send: &mut quinn::SendStream, msg: &Control, limits: &Limits) -> Result<(), String> {
    let head = msg.encode(0, limits).map_err(|e| e.to_string())?;
    send_frame(send, &head, None)
        .await
        .map_err(|e| e.to_string())
}
