//! Client sessions: a client (the SDK, a front door) opens one
//! bidirectional stream per operation (`LoadNetwork`, also as a dry run,
//! `Unload`, `QueryNetwork`, `ClusterInfo`, for named models `LoadModel`,
//! `UnloadModel`, `ListModels`, and for requesters `Routes`, a network's
//! routing table and its changes, and `Generation`, a generative
//! network's spec, and `Plan`, a loaded network's plan with its measured
//! runs); many run at once. A malformed operation fails on its
//! own stream; the session and the others go on. No request comes here.
//! A standby (HA) answers `Leader` and, to every other operation,
//! `NotLeader` with the leader's address.

use std::sync::Arc;

use bytes::Bytes;

use tessera_common::dump::{MeasuredRuns, PlanReport};
use tessera_common::memory::MemoryNeed;
use tessera_common::wire::client::{ClientReply, ClientRequest};
use tessera_common::wire::control::{CoordinatorInfo, WorkerState};
use tessera_common::wire::embed::EmbeddingSpec;
use tessera_common::wire::message::Message as _;
use tessera_common::wire::{Limits, Progress};
use tessera_net::{exchange, Peer};
use tokio::sync::mpsc;

use crate::network::Origin;
use crate::workers::WorkerEntry;
use crate::{deploy, planning, CoordinatorError, Shared};

/// Serves one client until it disconnects.
pub async fn serve_client(shared: Arc<Shared>, peer: Peer) {
    serve_streams(shared, peer.connection, peer.hello.node, None).await;
}

/// Serves a client's operation streams (after `first`, if one was taken
/// already) until it disconnects.
pub async fn serve_streams(
    shared: Arc<Shared>,
    connection: quinn::Connection,
    client: String,
    first: Option<(quinn::SendStream, quinn::RecvStream)>,
) {
    tracing::debug!(%client, "client connected");
    if let Some((send, recv)) = first {
        tokio::spawn(serve_operation(shared.clone(), send, recv));
    }
    loop {
        let (send, recv) = match connection.accept_bi().await {
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
    let started = std::time::Instant::now();
    let read = exchange::read_operation::<ClientRequest>(&mut recv, &limits).await;
    if let Ok(Some((msg, payload))) = &read {
        if payload.len() >= 1 << 20 {
            tracing::info!(
                operation = msg.name(),
                bytes = payload.len(),
                read_ms = started.elapsed().as_millis(),
                "received a client's payload"
            );
        }
    }
    let result = match read {
        // A standby serves no operation but `Leader` and the model copies
        // between coordinators: it names the leader.
        Ok(Some((msg, _))) if !shared.leads() && !any_coordinator_serves(&msg) => {
            let leader = shared.leader.borrow().leader.clone();
            write(&mut send, &ClientReply::NotLeader { leader }, &limits).await
        }
        // A subscription keeps its stream.
        Ok(Some((ClientRequest::Routes { network, model }, _))) => {
            return crate::routes::subscription(shared, network, model, send).await;
        }
        Ok(Some((msg, payload))) => operation(&shared, msg, payload, &mut send).await,
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

/// Whether a standby serves `msg` too: who leads, and model bytes copied
/// between coordinators.
fn any_coordinator_serves(msg: &ClientRequest) -> bool {
    matches!(
        msg,
        ClientRequest::Leader | ClientRequest::KeptModel { .. } | ClientRequest::CopyModel { .. }
    )
}

async fn operation(
    shared: &Arc<Shared>,
    msg: ClientRequest,
    payload: bytes::Bytes,
    send: &mut quinn::SendStream,
) -> Result<(), CoordinatorError> {
    let limits = *shared.node.limits();
    let (msg, payload) = take_tokenizer(msg, payload)?;
    if matches!(
        msg,
        ClientRequest::LoadNetwork(_)
            | ClientRequest::LoadKnown { .. }
            | ClientRequest::LoadModel { .. }
            | ClientRequest::QueryNetwork { .. }
    ) {
        crate::state::restore::rejoined(shared).await;
    }
    match msg {
        ClientRequest::LoadNetwork(request) => {
            load_sent(shared, request, (payload, None), send).await
        }
        ClientRequest::LoadKnown {
            request,
            model_sha256,
        } => match crate::known::find(shared, &model_sha256).await {
            Some(model) => load_sent(shared, request, (model, Some(model_sha256)), send).await,
            None => write(send, &ClientReply::ModelUnknown, &limits).await,
        },
        ClientRequest::LoadModel { name, request } => {
            load_model(shared, name, request, payload, send).await
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
        ClientRequest::ClusterInfo => {
            let coordinators = crate::ha::coordinators(shared).await;
            write(send, &cluster_state(shared, coordinators), &limits).await
        }
        ClientRequest::Generation { network } => {
            send_generation_spec(shared, network, send, &limits).await
        }
        ClientRequest::Embedding { network } => {
            send_embedding_spec(shared, network, send, &limits).await
        }
        ClientRequest::Routes { .. } => Err(CoordinatorError::BadInput(
            "a routes subscription on an operation's stream".into(),
        )),
        ClientRequest::Unload { network } => {
            deploy::unload(shared, network).await?;
            write(send, &ClientReply::Unloaded { network }, &limits).await
        }
        ClientRequest::Leader => {
            write(send, &crate::ha::leader_answer(shared).await, &limits).await
        }
        ClientRequest::Plan { network } => {
            let plan = Box::new(measured_plan(shared, network)?);
            write(send, &ClientReply::NetworkLoaded { network, plan }, &limits).await
        }
        ClientRequest::KeptModel { sha256 } => {
            crate::ha::model_copies::send_kept(shared, sha256, send).await
        }
        ClientRequest::CopyModel { sha256 } => {
            crate::ha::model_copies::copy(shared, sha256, send).await
        }
    }
}

/// `LoadNetwork` (or `LoadKnown`, its bytes found here): planned only
/// (a dry run) or loaded.
async fn load_sent(
    shared: &Arc<Shared>,
    request: tessera_common::wire::control::LoadRequest,
    (model, sha256): (Bytes, Option<String>),
    send: &mut quinn::SendStream,
) -> Result<(), CoordinatorError> {
    let limits = *shared.node.limits();
    let (tx, rx) = mpsc::channel::<Progress>(64);
    if request.dry_run {
        let plan = with_progress(
            planning::dry_run(shared, request, model, tx),
            rx,
            send,
            &limits,
        );
        let plan = Box::new(plan.await?);
        let reply = ClientReply::NetworkLoaded { network: 0, plan };
        return write(send, &reply, &limits).await;
    }
    let model = (model, Origin::Sent, sha256);
    let loaded = deploy::load_network(shared, request, model, tx);
    let loaded = with_progress(loaded, rx, send, &limits).await?;
    write(send, &network_loaded(&loaded), &limits).await
}

/// `LoadModel`: a named model loaded (defined anew from the payload, or
/// placed anew, or as the repository has it).
async fn load_model(
    shared: &Arc<Shared>,
    name: String,
    request: Option<tessera_common::wire::control::LoadRequest>,
    payload: Bytes,
    send: &mut quinn::SendStream,
) -> Result<(), CoordinatorError> {
    let limits = *shared.node.limits();
    let new = match request {
        // Placed anew from the model as the coordinator has it.
        Some(r) if payload.is_empty() => Some(placed_anew(shared, &name, r)?),
        Some(r) => Some((
            crate::repository::Source::Bytes(crate::repository::Sent::new(payload)),
            r,
        )),
        None => None,
    };
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

/// A generative network's spec, its tokenizer as the payload.
async fn send_generation_spec(
    shared: &Arc<Shared>,
    network: u64,
    send: &mut quinn::SendStream,
    limits: &Limits,
) -> Result<(), CoordinatorError> {
    let generative = shared
        .networks
        .get(&network)
        .map(|n| n.generator.clone())
        .ok_or(CoordinatorError::UnknownNetwork(network))?;
    let Some(g) = generative else {
        let name = shared.networks.get(&network).map(|n| n.name.clone());
        return Err(CoordinatorError::BadInput(format!(
            "model '{}' does not generate",
            name.unwrap_or_default()
        )));
    };
    let mut spec = g.spec.clone();
    spec.tokenizer_bytes = spec.tokenizer_json.len() as u64;
    let payload = Bytes::from(spec.tokenizer_json.clone().into_bytes());
    let reply = ClientReply::Generation(Box::new(spec));
    Ok(exchange::send_message(send, &reply, Some(&payload), limits).await?)
}

/// `Embedding`: an embedding network's spec, its tokenizer the payload.
async fn send_embedding_spec(
    shared: &Arc<Shared>,
    network: u64,
    send: &mut quinn::SendStream,
    limits: &Limits,
) -> Result<(), CoordinatorError> {
    let (name, embedder) = shared
        .networks
        .get(&network)
        .map(|n| (n.name.clone(), n.embedder.clone()))
        .ok_or(CoordinatorError::UnknownNetwork(network))?;
    let Some(spec) = embedder else {
        return Err(CoordinatorError::BadInput(format!(
            "model '{name}' does not embed"
        )));
    };
    // The header leaves the tokenizer out (serde skips it); the payload
    // holds it.
    let mut header = EmbeddingSpec::clone(&spec);
    let payload = header.join_payload(&[]);
    let reply = ClientReply::Embedding(Box::new(header));
    Ok(exchange::send_message(send, &reply, Some(&payload), limits).await?)
}

/// A generative or embedding network's tokenizer follows its model in a
/// load's payload: taken into the load's spec, the model left.
fn take_tokenizer(
    msg: ClientRequest,
    payload: Bytes,
) -> Result<(ClientRequest, Bytes), CoordinatorError> {
    let split = |request: &mut tessera_common::wire::control::LoadRequest, payload: Bytes| {
        let bad = |e: String| CoordinatorError::BadInput(e);
        match (request.generation.as_mut(), request.embedding.as_mut()) {
            (Some(_), Some(_)) => Err(bad("a model either generates or embeds, not both".into())),
            (Some(g), None) => g.split_payload(payload).map_err(|e| bad(e.to_string())),
            (None, Some(e)) => e.split_payload(payload).map_err(|e| bad(e.to_string())),
            (None, None) => Ok(payload),
        }
    };
    Ok(match msg {
        ClientRequest::LoadNetwork(mut request) => {
            let payload = split(&mut request, payload)?;
            (ClientRequest::LoadNetwork(request), payload)
        }
        ClientRequest::LoadKnown {
            mut request,
            model_sha256,
        } => {
            if !split(&mut request, payload)?.is_empty() {
                return Err(CoordinatorError::BadInput(
                    "a load of known model bytes carries no model".into(),
                ));
            }
            let msg = ClientRequest::LoadKnown {
                request,
                model_sha256,
            };
            (msg, Bytes::new())
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

/// A named model placed anew by `request`, from the model the coordinator
/// has (its file, or the bytes a client sent); a generative (embedding)
/// model stays generative (embedding).
fn placed_anew(
    shared: &Shared,
    name: &str,
    mut request: tessera_common::wire::control::LoadRequest,
) -> Result<
    (
        crate::repository::Source,
        tessera_common::wire::control::LoadRequest,
    ),
    CoordinatorError,
> {
    let entry = shared
        .repository
        .get(name)
        .ok_or_else(|| CoordinatorError::UnknownModel(name.to_string()))?;
    let had = entry.request();
    if request.generation.is_none() {
        request.generation = had.generation;
    }
    if request.embedding.is_none() {
        request.embedding = had.embedding;
    }
    Ok((entry.source(), request))
}

/// The cluster's workers as clients see them (`tessera cluster`).
fn cluster_state(shared: &Shared, coordinators: Vec<CoordinatorInfo>) -> ClientReply {
    let in_use = crate::planning::memory_needs(shared, None);
    let per_kind = |w: &WorkerEntry, of: fn(&MemoryNeed) -> u64| -> Vec<(String, u64)> {
        w.devices
            .iter()
            .map(|d| {
                let id = format!("{}/{}", w.name, d.device);
                (d.device.clone(), in_use.get(&id).map_or(0, of))
            })
            .collect()
    };
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
            memory_in_use: per_kind(&w, MemoryNeed::total),
            state_in_use: per_kind(&w, |n| n.state),
            rss_bytes: w.rss_bytes.load(std::sync::atomic::Ordering::Relaxed),
            compiles: w.compiles.lock().map(|c| *c).unwrap_or_default(),
            phase: w.phase(),
        })
        .collect();
    workers.sort_by(|a, b| a.name.cmp(&b.name));
    let in_flight = shared
        .workers
        .iter()
        .map(|w| w.running.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    ClientReply::ClusterState {
        workers,
        networks: shared.networks.len() as u32,
        in_flight,
        coordinators,
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

/// Network `network`'s plan with its subgraphs' runs as their workers'
/// last heartbeats counted them.
fn measured_plan(shared: &Shared, network: u64) -> Result<PlanReport, CoordinatorError> {
    let loaded = shared
        .networks
        .get(&network)
        .ok_or(CoordinatorError::UnknownNetwork(network))?;
    let mut plan = loaded.plan();
    let measured_of = |deployed: &crate::network::Deployed| -> Vec<Option<MeasuredRuns>> {
        deployed
            .plan
            .subgraphs
            .iter()
            .map(|sg| {
                let worker = shared.workers.get(sg.host.as_deref()?)?;
                let reported = worker.reported.lock().ok()?;
                let load = reported
                    .subgraphs
                    .iter()
                    .find(|l| l.network == deployed.id && l.subgraph as usize == sg.id)?;
                Some(MeasuredRuns {
                    runs: load.runs,
                    failed: load.failed,
                    busy_us: load.busy_us,
                    depth: load.depth,
                })
            })
            .collect()
    };
    let deployed = loaded.deployments();
    if let Some(first) = deployed.first() {
        for (sg, m) in plan.subgraphs.iter_mut().zip(measured_of(first)) {
            sg.measured = m;
        }
    }
    for (replica, d) in plan.replicas.iter_mut().zip(&deployed) {
        replica.measured = measured_of(d);
    }
    Ok(plan)
}
