//! Client sessions: a client opens one bidirectional stream per operation
//! (`LoadNetwork`, `Infer`, `Unload`); many run at once. A malformed
//! operation fails on its own stream; the session and the others go on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tessera_common::wire::control::Control;
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
        Control::LoadNetwork(request) => {
            let (tx, mut rx) = mpsc::channel::<Control>(64);
            let loading = load::load_network(shared, request, payload, tx);
            tokio::pin!(loading);
            // Forward progress while loading.
            let loaded = loop {
                tokio::select! {
                    result = &mut loading => break result,
                    Some(p) = rx.recv() => write(send, &p, &limits).await?,
                }
            };
            let deployed = loaded.map_err(|e| e.to_string())?;
            let msg = Control::NetworkLoaded {
                network: deployed.id,
                plan: deployed.plan.clone(),
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
                subgraphs: done.subgraphs,
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

async fn write(send: &mut quinn::SendStream, msg: &Control, limits: &Limits) -> Result<(), String> {
    let head = msg.encode(0, limits).map_err(|e| e.to_string())?;
    send_frame(send, &head, None)
        .await
        .map_err(|e| e.to_string())
}
