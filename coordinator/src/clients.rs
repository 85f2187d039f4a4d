//! Client sessions: a client opens one bidirectional stream per operation
//! (`LoadNetwork`, also as a dry run, `Infer`, `Unload`, `QueryNetwork`,
//! `ClusterInfo`, and for named models `LoadModel`, `UnloadModel`,
//! `ListModels`); many run at once. A malformed
//! operation fails on its own stream; the session and the others go on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use tessera_common::wire::client::{ClientReply, ClientRequest};
use tessera_common::wire::control::WorkerState;
use tessera_common::wire::generate::{GenerateParams, Prompt};
use tessera_common::wire::tensor::TensorHeader;
use tessera_common::wire::{Frame, Limits, Progress};
use tessera_net::{exchange, recv_frame, send_frame, NetError, Peer};
use tokio::sync::mpsc;

use crate::{deploy, generate, planning, requests, CoordinatorError, Shared};

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
    let result = match exchange::read_operation::<ClientRequest>(&mut recv, &limits).await {
        Ok(Some((msg, payload))) => operation(&shared, msg, payload, &mut send, &mut recv).await,
        Ok(None) => return,
        Err(e) => Err(CoordinatorError::BadInput(e.to_string())),
    };
    if let Err(error) = result {
        tracing::debug!("client operation failed: {error}");
        let sent = exchange::send_failure::<ClientReply>(
            &mut send,
            error.kind(),
            error.to_string(),
            &limits,
        );
        let _ = sent.await;
    }
    let _ = send.finish();
}

async fn operation(
    shared: &Arc<Shared>,
    msg: ClientRequest,
    payload: bytes::Bytes,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
) -> Result<(), CoordinatorError> {
    let limits = *shared.node.limits();
    let (msg, payload) = take_tokenizer(msg, payload)?;
    match msg {
        ClientRequest::LoadNetwork(request) if request.dry_run => {
            let (tx, rx) = mpsc::channel::<Progress>(64);
            let plan = with_progress(
                planning::dry_run(shared, request, payload, tx),
                rx,
                send,
                &limits,
            )
            .await?;
            let plan = Box::new(plan);
            write(
                send,
                &ClientReply::NetworkLoaded { network: 0, plan },
                &limits,
            )
            .await
        }
        ClientRequest::LoadNetwork(request) => {
            let (tx, rx) = mpsc::channel::<Progress>(64);
            let loaded = with_progress(
                deploy::load_network(shared, request, payload, tx),
                rx,
                send,
                &limits,
            )
            .await?;
            write(send, &network_loaded(&loaded), &limits).await
        }
        ClientRequest::LoadModel { name, request } => {
            let new = request.map(|r| (crate::repository::Source::Bytes(payload), r));
            let (tx, rx) = mpsc::channel::<Progress>(64);
            let loaded = with_progress(
                crate::repository::load(shared, &name, new, tx),
                rx,
                send,
                &limits,
            )
            .await?;
            write(send, &network_loaded(&loaded), &limits).await
        }
        ClientRequest::UnloadModel { name } => {
            crate::repository::unload(shared, &name).await?;
            write(send, &ClientReply::ModelUnloaded { name }, &limits).await
        }
        ClientRequest::ListModels => {
            let models = crate::repository::statuses(shared);
            write(send, &ClientReply::Models { models }, &limits).await
        }
        ClientRequest::QueryNetwork { devices } => {
            let (tx, rx) = mpsc::channel::<Progress>(64);
            let spec = devices.join(",");
            let answers = with_progress(
                planning::query(shared, &spec, payload, tx),
                rx,
                send,
                &limits,
            )
            .await?;
            write(send, &ClientReply::QueryResult { answers }, &limits).await
        }
        ClientRequest::ClusterInfo => write(send, &cluster_state(shared), &limits).await,
        ClientRequest::Infer {
            network,
            request,
            inputs,
            deadline_ms,
        } => {
            let deadline = (deadline_ms > 0).then(|| Duration::from_millis(deadline_ms));
            serve_infer(shared, network, request, inputs, deadline, send, recv).await
        }
        ClientRequest::Generate {
            network,
            prompt,
            params,
        } => serve_generate(shared, network, prompt, params, send).await,
        ClientRequest::Unload { network } => {
            deploy::unload(shared, network).await?;
            write(send, &ClientReply::Unloaded { network }, &limits).await
        }
    }
}

/// A generative network's tokenizer follows its model in a load's payload:
/// taken into the load's generation spec, the model left.
fn take_tokenizer(
    msg: ClientRequest,
    payload: Bytes,
) -> Result<(ClientRequest, Bytes), CoordinatorError> {
    let split =
        |request: &mut tessera_common::wire::control::LoadRequest, payload: Bytes| match request
            .generation
            .as_mut()
        {
            Some(g) => g
                .split_payload(payload)
                .map_err(|e| CoordinatorError::BadInput(e.to_string())),
            None => Ok(payload),
        };
    Ok(match msg {
        ClientRequest::LoadNetwork(mut request) => {
            let payload = split(&mut request, payload)?;
            (ClientRequest::LoadNetwork(request), payload)
        }
        ClientRequest::LoadModel {
            name,
            request: Some(mut request),
        } => {
            let payload = split(&mut request, payload)?;
            let request = Some(request);
            (ClientRequest::LoadModel { name, request }, payload)
        }
        other => (other, payload),
    })
}

/// One request: its input tensors (on the same stream), then the answer
/// and the output tensors.
async fn serve_infer(
    shared: &Arc<Shared>,
    network: u64,
    request: u64,
    inputs: u32,
    deadline: Option<Duration>,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
) -> Result<(), CoordinatorError> {
    let limits = *shared.node.limits();
    let bad = |what: String| CoordinatorError::BadInput(format!("request {request}: {what}"));
    let mut tensors = HashMap::new();
    for _ in 0..inputs {
        match recv_frame::<ClientRequest>(recv, &limits).await {
            Ok(Some(Frame::Tensor(header, payload))) => {
                let name = header.name.clone();
                let t = header
                    .into_tensor(payload)
                    .map_err(|e| bad(e.to_string()))?;
                tensors.insert(name, t);
            }
            Ok(other) => {
                return Err(bad(format!(
                    "expected {inputs} input tensors, got {other:?}"
                )))
            }
            Err(e) => return Err(bad(e.to_string())),
        }
    }
    let done = requests::infer(shared, network, tensors, deadline).await?;
    let reply = ClientReply::InferDone {
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
            .map_err(NetError::from)?;
        send_frame(send, &head, Some(&t.shared_bytes())).await?;
    }
    Ok(())
}

/// A generation: `Tokens` as they come, then `Generated`. A client that
/// goes away ends it (its stages free the sequence).
async fn serve_generate(
    shared: &Arc<Shared>,
    network: u64,
    prompt: Prompt,
    params: GenerateParams,
    send: &mut quinn::SendStream,
) -> Result<(), CoordinatorError> {
    let limits = *shared.node.limits();
    let (tx, mut rx) = mpsc::channel::<generate::Chunk>(64);
    let work = generate::generate(shared, network, &prompt, &params, tx);
    tokio::pin!(work);
    let mut work_done = None;
    loop {
        tokio::select! {
            result = &mut work, if work_done.is_none() => work_done = Some(result),
            chunk = rx.recv() => match chunk {
                Some(c) => {
                    let msg = ClientReply::Tokens { ids: c.ids, text: c.text };
                    // A client gone: dropping the work ends the sequence.
                    write(send, &msg, &limits).await?;
                }
                None => break,
            },
        }
    }
    let stats = match work_done {
        Some(result) => result?,
        None => work.await?,
    };
    write(send, &ClientReply::Generated(stats), &limits).await
}

/// The cluster's workers as clients see them (`tessera cluster`).
fn cluster_state(shared: &Shared) -> ClientReply {
    let in_use = crate::planning::memory_in_use(shared, None);
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
                .filter(|n| n.deployments().iter().any(|d| d.hosts.contains(&w.name)))
                .map(|n| n.id)
                .collect(),
            memory_in_use: w
                .devices
                .iter()
                .map(|d| {
                    let id = format!("{}/{}", w.name, d.device);
                    (d.device.clone(), in_use.get(&id).copied().unwrap_or(0))
                })
                .collect(),
            rss_bytes: w.rss_bytes.load(std::sync::atomic::Ordering::Relaxed),
        })
        .collect();
    workers.sort_by(|a, b| a.name.cmp(&b.name));
    ClientReply::ClusterState {
        workers,
        networks: shared.networks.len() as u32,
        in_flight: shared.pending.len() as u32,
    }
}

/// The answer to a load: the network's id and its current plan.
fn network_loaded(loaded: &crate::network::Loaded) -> ClientReply {
    ClientReply::NetworkLoaded {
        network: loaded.id,
        plan: Box::new(loaded.plan()),
    }
}

/// Runs `work`, forwarding the progress it reports to the client.
async fn with_progress<T>(
    work: impl std::future::Future<Output = Result<T, CoordinatorError>>,
    mut progress: mpsc::Receiver<Progress>,
    send: &mut quinn::SendStream,
    limits: &Limits,
) -> Result<T, CoordinatorError> {
    tokio::pin!(work);
    loop {
        tokio::select! {
            result = &mut work => {
                // What was reported just before the end still goes out.
                while let Ok(p) = progress.try_recv() {
                    write(send, &ClientReply::Progress(p), limits).await?;
                }
                return result;
            }
            Some(p) = progress.recv() => write(send, &ClientReply::Progress(p), limits).await?,
        }
    }
}

async fn write(
    send: &mut quinn::SendStream,
    msg: &ClientReply,
    limits: &Limits,
) -> Result<(), CoordinatorError> {
    Ok(exchange::send_message(send, msg, None, limits).await?)
}
