//! The coordinator's operations on a worker, one per stream: QueryNetwork,
//! Deploy (compile or load from the cache, start the subgraph's actor),
//! Undeploy, Cancel.

use std::sync::Arc;
use std::time::Instant;

use actix::Actor;
use bytes::Bytes;
use tessera_common::onnx::{decode_model, OnnxError};
use tessera_common::wire::cluster::{ToWorker, WorkerAnswer};
use tessera_common::wire::control::{DeploySpec, Destination, DeviceAnswer, ErrorKind, TypeReport};
use tessera_common::wire::pieces::{self, Assembled, PieceError, PieceRef};
use tessera_common::wire::{Message, Progress};
use tessera_net::exchange::{self, ExchangeError};
use tessera_net::NetError;

use crate::plugin::PluginError;

use super::actor::{stop_all, SubgraphActor};
use super::admission::Admission;
use super::local_models::LocalModels;
use super::sequences::StateSlots;
use super::State;

/// One operation stream from the coordinator.
pub(super) async fn serve_operation(
    state: Arc<State>,
    session: u64,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let limits = *state.node.limits();
    let reply = match exchange::read_operation::<ToWorker>(&mut recv, &limits).await {
        Ok(Some((msg, payload))) => {
            operation(&state, session, msg, payload, &mut send, &mut recv).await
        }
        Ok(None) => return,
        Err(e) => Err(OperationError::Read(e)),
    };
    let sent = match reply {
        Ok((answer, payload)) => {
            exchange::send_message(&mut send, &answer, payload.as_ref(), &limits).await
        }
        Err(error) => {
            tracing::warn!("{error}");
            exchange::send_failure::<WorkerAnswer>(
                &mut send,
                ErrorKind::Worker,
                error.to_string(),
                &limits,
            )
            .await
        }
    };
    if let Err(e) = sent {
        tracing::debug!("answering the coordinator: {e}");
    }
    let _ = send.finish();
}

async fn operation(
    state: &Arc<State>,
    session: u64,
    msg: ToWorker,
    payload: Bytes,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
) -> Result<(WorkerAnswer, Option<Bytes>), OperationError> {
    if let Some(epoch) = msg.epoch() {
        if !state.leaders.allows(epoch) {
            let newest = state.leaders.newest();
            return Err(OperationError::Fenced { epoch, newest });
        }
    }
    let answer = match msg {
        ToWorker::Weights { sha256, source, .. } => {
            let (held, payload) = super::weights::held(state, sha256, source).await?;
            return Ok((WorkerAnswer::Weights { held }, Some(payload)));
        }
        ToWorker::QueryNetwork { devices, .. } => {
            let model = decode_model(&payload).map_err(OperationError::BadModel)?;
            let state = state.clone();
            tokio::task::spawn_blocking(move || {
                let mut answers = Vec::new();
                for kind in &devices {
                    let device = state.device(kind)?;
                    let r = device.plugin.query_network(&model).map_err(|source| {
                        OperationError::Query {
                            worker: state.name.clone(),
                            device: kind.clone(),
                            source,
                        }
                    })?;
                    answers.push(DeviceAnswer {
                        device: kind.clone(),
                        supported: r.supported.into_iter().collect(),
                        unsupported: r.unsupported.into_iter().collect(),
                        types: r
                            .types
                            .values()
                            .map(|s| TypeReport {
                                tensor: s.name.clone(),
                                found: s.reported_type(),
                            })
                            .collect(),
                    });
                }
                Ok(WorkerAnswer::QueryResult { answers })
            })
            .await
            .map_err(OperationError::Task)??
        }
        ToWorker::Deploy { spec, .. } => deploy(state, session, *spec, send, recv).await?,
        ToWorker::Undeploy { network, .. } => {
            // Answered once the compute threads have ended and dropped
            // their sessions: the memory is free when the answer comes.
            stop_all(state.router.remove(network)).await;
            WorkerAnswer::Undeployed { network }
        }
        ToWorker::Model => return Err(OperationError::UnaskedModel),
    };
    Ok((answer, None))
}

/// Why an operation of the coordinator failed here (its answer is a
/// `Failed` that says so).
#[derive(Debug, thiserror::Error)]
pub(super) enum OperationError {
    /// The operation's frame could not be read.
    #[error(transparent)]
    Read(ExchangeError),
    #[error("QueryNetwork: {0}")]
    BadModel(OnnxError),
    #[error("{worker} has no device {device}; it serves {}", serves.join(", "))]
    NoDevice {
        worker: String,
        device: String,
        serves: Vec<String>,
    },
    #[error("{worker}/{device} QueryNetwork: {source}")]
    Query {
        worker: String,
        device: String,
        source: PluginError,
    },
    /// The coordinator that sent a Deploy was lost while it compiled.
    #[error("subgraph {subgraph} of deployment {network} was compiled for a coordinator session that is over")]
    SessionOver { network: u64, subgraph: u32 },
    /// From a coordinator whose epoch is older than the newest leader's:
    /// it no longer leads.
    #[error("refused: epoch {epoch} is older than the leader's ({newest}); this coordinator no longer leads")]
    Fenced { epoch: u64, newest: u64 },
    #[error("a model came without a Deploy to ask for it")]
    UnaskedModel,
    #[error("asking for the model: {0}")]
    AskModel(NetError),
    #[error("the model of subgraph {subgraph} came with {got} bytes, {announced} were announced")]
    ModelSize {
        subgraph: u32,
        got: u64,
        announced: u64,
    },
    #[error("expected the model, got {0}")]
    NotTheModel(&'static str),
    #[error("the coordinator sent no model")]
    NoModel,
    #[error("putting the model together: {0}")]
    Pieces(PieceError),
    #[error("receiving the model: {0}")]
    ReceiveModel(ExchangeError),
    #[error("{what}: {source}")]
    Compile { what: String, source: PluginError },
    /// A blocking task of the operation panicked or was cancelled.
    #[error("{0}")]
    Task(tokio::task::JoinError),
}

/// The subgraph from the compile cache, if it holds a usable one.
async fn from_cache(
    state: &Arc<State>,
    plugin: &Arc<dyn crate::plugin::DevicePlugin>,
    key: &str,
) -> Option<Arc<dyn crate::plugin::CompiledSubgraph>> {
    let cache = state.cache.clone()?;
    let (plugin, key) = (plugin.clone(), key.to_string());
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let (blob, file) = cache.get_file(&key)?;
        let read_ms = started.elapsed().as_millis();
        let imported = plugin.import_file(&blob, &file);
        tracing::debug!(
            read_ms,
            import_ms = started.elapsed().as_millis() - read_ms,
            "from the compile cache"
        );
        imported
            .map_err(|e| tracing::warn!("cached subgraph {key} unusable, recompiling: {e}"))
            .ok()
    })
    .await
    .ok()
    .flatten()
}

/// Asks the coordinator for the subgraph's model on this stream, less the
/// weights this worker holds, and puts it together: the model and the
/// weights that came (to keep).
async fn receive_model(
    state: &Arc<State>,
    spec: &DeploySpec,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
) -> Result<Assembled, OperationError> {
    let limits = *state.node.limits();
    let held = held_weights(state, spec).await?;
    let missing = pieces::missing(&spec.pieces, &held);
    let announced = pieces::payload_len(&spec.pieces, &missing);
    let ask = WorkerAnswer::NeedModel {
        missing: missing.clone(),
    };
    exchange::send_message(send, &ask, None, &limits)
        .await
        .map_err(OperationError::AskModel)?;
    let payload = match exchange::read_operation::<ToWorker>(recv, &limits).await {
        Ok(Some((ToWorker::Model, payload))) if payload.len() as u64 == announced => payload,
        Ok(Some((ToWorker::Model, payload))) => {
            return Err(OperationError::ModelSize {
                subgraph: spec.subgraph,
                got: payload.len() as u64,
                announced,
            })
        }
        Ok(Some((other, _))) => return Err(OperationError::NotTheModel(other.name())),
        Ok(None) => return Err(OperationError::NoModel),
        Err(e) => return Err(OperationError::ReceiveModel(e)),
    };
    tracing::info!(
        subgraph = spec.subgraph,
        received = payload.len(),
        model = spec.model_bytes,
        weights_held = held.iter().flatten().count(),
        "received the subgraph's model"
    );
    let pieces = spec.pieces.clone();
    tokio::task::spawn_blocking(move || pieces::assemble(&pieces, &held, payload))
        .await
        .map_err(OperationError::Task)?
        .map_err(OperationError::Pieces)
}

/// Per piece of the spec, the weight as this worker holds it (hash
/// checked), if it does: in its weight store, else in the model the spec
/// names where this worker may read it from its own disk.
async fn held_weights(
    state: &Arc<State>,
    spec: &DeploySpec,
) -> Result<Vec<Option<Bytes>>, OperationError> {
    let (store, local) = (state.weights.clone(), state.local_models.clone());
    let (pieces, source) = (spec.pieces.clone(), spec.source.clone());
    tokio::task::spawn_blocking(move || {
        let mut held: Vec<Option<Bytes>> = pieces
            .iter()
            .map(|p| match (p, &store) {
                (PieceRef::Weight { sha256, .. }, Some(store)) => store.get(sha256),
                _ => None,
            })
            .collect();
        let lacking = pieces::missing(&pieces, &held);
        if let (false, Some(local), Some(source)) = (lacking.is_empty(), local, source) {
            from_own_disk(&local, &source, &pieces, &mut held);
        }
        held
    })
    .await
    .map_err(OperationError::Task)
}

/// Fills the weights `held` lacks from the model read from `source`, where
/// this worker may read it (blocking: the first read hashes its weights).
pub(super) fn from_own_disk(
    local: &LocalModels,
    source: &str,
    pieces: &[PieceRef],
    held: &mut [Option<Bytes>],
) {
    let Some(path) = local.find(source) else {
        tracing::debug!(source, "the model is not on this worker's disk");
        return;
    };
    let weights = match local.weights(&path) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("reading the model on this worker's disk: {e}; receiving its weights");
            return;
        }
    };
    let mut found = 0;
    for (piece, held) in pieces.iter().zip(held.iter_mut()) {
        if let (PieceRef::Weight { sha256, .. }, None) = (piece, &held) {
            *held = weights.get(sha256).cloned();
            found += usize::from(held.is_some());
        }
    }
    tracing::info!(path = %path.display(), found, "weights from this worker's disk");
}

/// Compiles (or loads from the cache) one subgraph and starts its actor.
/// The model crosses the network only when the cache does not hold it.
#[tracing::instrument(skip_all, fields(network = spec.network, subgraph = spec.subgraph, device = %spec.device))]
async fn deploy(
    state: &Arc<State>,
    session: u64,
    spec: DeploySpec,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
) -> Result<WorkerAnswer, OperationError> {
    let started = Instant::now();
    let (compiled, cached) = compiled(state, &spec, send, recv).await?;
    // Its coordinator was lost meanwhile: the next one neither knows nor
    // adopts it, so it is not started (nothing would ever unload it).
    if state.session() != session {
        return Err(OperationError::SessionOver {
            network: spec.network,
            subgraph: spec.subgraph,
        });
    }
    let compile_ms = started.elapsed().as_millis() as u64;
    tracing::info!(subgraph = spec.subgraph, device = %spec.device, compile_ms, cached, "deployed");
    let counter = if cached {
        &state.router.telemetry.cache_loads
    } else {
        &state.router.telemetry.compiled
    };
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    start_actor(state, &spec, compiled);
    state
        .router
        .deployments
        .hold(spec.network, spec.subgraph, &spec.model_hash);
    dial_peers(state, &spec);
    Ok(WorkerAnswer::Deployed {
        network: spec.network,
        subgraph: spec.subgraph,
        compile_ms,
        cached,
    })
}

/// The subgraph from the compile cache, else received and compiled (and
/// put in the cache); whether it came from the cache.
async fn compiled(
    state: &Arc<State>,
    spec: &DeploySpec,
    send: &mut quinn::SendStream,
    recv: &mut quinn::RecvStream,
) -> Result<(Arc<dyn crate::plugin::CompiledSubgraph>, bool), OperationError> {
    let limits = *state.node.limits();
    let what = format!(
        "compiling subgraph {} on {}/{}",
        spec.subgraph, state.name, spec.device
    );
    let plugin = state.device(&spec.device)?.plugin.clone();
    let key = format!("{}-{}", spec.device, spec.model_hash);
    if let Some(c) = from_cache(state, &plugin, &key).await {
        return Ok((c, true));
    }
    let Assembled { model, received } = receive_model(state, spec, send, recv).await?;
    let progress = WorkerAnswer::Progress(Progress {
        what: what.clone(),
        done: 0,
        total: 1,
    });
    if let Err(e) = exchange::send_message(send, &progress, None, &limits).await {
        tracing::debug!("reporting progress: {e}");
    }
    let (cache, config) = (state.cache.clone(), state.config.clone());
    let weights = state.weights.clone();
    let compiled = tokio::task::spawn_blocking(move || {
        if let Some(store) = &weights {
            for (sha256, bytes) in &received {
                store.put(sha256, bytes);
            }
        }
        drop(received);
        let compiled = plugin.compile(&model, &config)?;
        // The model's bytes go with this closure: the worker keeps what
        // the compiled subgraph holds, nothing more.
        drop(model);
        if let Some(cache) = &cache {
            match compiled.export() {
                Ok(blob) => cache.put(&key, &blob),
                Err(e) => tracing::debug!("not caching {key}: {e}"),
            }
        }
        Ok::<_, PluginError>(compiled)
    })
    .await
    .map_err(OperationError::Task)?
    .map_err(|source| OperationError::Compile { what, source })?;
    Ok((compiled, false))
}

/// Starts the subgraph's actor and registers its inputs, routes and state.
fn start_actor(
    state: &Arc<State>,
    spec: &DeploySpec,
    compiled: Arc<dyn crate::plugin::CompiledSubgraph>,
) {
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
    let state_slots = StateSlots::new(&inputs, &outputs, &spec.state);
    for slot in &state_slots.writes {
        if let Some(name) = outputs.get(slot.at) {
            state
                .router
                .deployments
                .mark_state_output(spec.network, name.clone());
        }
    }
    let mut actor = SubgraphActor::new(
        spec.network,
        spec.subgraph,
        format!("{}/{}", state.name, spec.device),
        compiled,
        inputs.clone(),
        outputs,
        state.router.clone(),
        state.mailbox,
    );
    actor.batching = spec.batching.filter(|b| b.max_batch > 1);
    if !state_slots.is_empty() {
        actor.store = state
            .router
            .sequences
            .store(spec.network, spec.max_sequences);
        let mut store = actor.store.lock().unwrap_or_else(|p| p.into_inner());
        store.add_reader(&state_slots);
        drop(store);
        actor.admission = Admission::new(
            spec.max_queued,
            std::time::Duration::from_millis(spec.queue_timeout_ms),
        );
    }
    let state_only = !inputs.is_empty() && state_slots.reads.len() == inputs.len();
    actor.state = state_slots;
    let actor = SubgraphActor::start_in_arbiter(&state.arbiter, move |_| actor);
    state
        .router
        .deployments
        .add(spec.network, &actor, &inputs, state_only, routes);
}

/// Dials the workers a subgraph streams to now, not on the first request.
fn dial_peers(state: &Arc<State>, spec: &DeploySpec) {
    for route in &spec.outputs {
        for dest in &route.to {
            if let Destination::Worker { name, addr } = dest {
                if *name != state.name {
                    let (router, name, addr) = (state.router.clone(), name.clone(), addr.clone());
                    tokio::spawn(async move {
                        if let Err(e) = router.peers.link(&name, &addr).await {
                            tracing::warn!("{e}");
                        }
                    });
                }
            }
        }
    }
}
