//! The coordinator's operations on a worker, one per stream: QueryNetwork,
//! Deploy (compile or load from the cache, start the subgraph's actor),
//! Undeploy, Cancel.

use std::sync::Arc;
use std::time::Instant;

use actix::Actor;
use bytes::Bytes;
use tessera_common::onnx::decode_model;
use tessera_common::wire::control::{Control, DeploySpec, Destination, DeviceAnswer, ErrorKind};
use tessera_net::exchange;

use super::actor::{Stop, SubgraphActor};
use super::State;

/// One operation stream from the coordinator.
pub(super) async fn serve_operation(
    state: Arc<State>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let limits = *state.node.limits();
    let reply = match exchange::read_operation(&mut recv, &limits).await {
        Ok(Some((msg, payload))) => operation(&state, msg, payload, &mut send).await,
        Ok(None) => return,
        Err(e) => Err(e.to_string()),
    };
    let sent = match reply {
        Ok(answer) => exchange::send_message(&mut send, &answer, None, &limits).await,
        Err(error) => {
            tracing::warn!("{error}");
            exchange::send_failure(&mut send, None, ErrorKind::Worker, error, &limits).await
        }
    };
    if let Err(e) = sent {
        tracing::debug!("answering the coordinator: {e}");
    }
    let _ = send.finish();
}

async fn operation(
    state: &Arc<State>,
    msg: Control,
    payload: Bytes,
    send: &mut quinn::SendStream,
) -> Result<Control, String> {
    match msg {
        Control::QueryNetwork { devices } => {
            let model = decode_model(&payload).map_err(|e| format!("QueryNetwork: {e}"))?;
            let state = state.clone();
            tokio::task::spawn_blocking(move || {
                let mut answers = Vec::new();
                for kind in &devices {
                    let device = state.device(kind)?;
                    let r = device
                        .plugin
                        .query_network(&model)
                        .map_err(|e| format!("{}/{kind} QueryNetwork: {e}", state.name))?;
                    answers.push(DeviceAnswer {
                        device: kind.clone(),
                        supported: r.supported.into_iter().collect(),
                        unsupported: r.unsupported.into_iter().collect(),
                        types: r
                            .types
                            .into_values()
                            .map(|s| {
                                let dims = s.shape.map(|d| {
                                    d.iter().map(|v| v.map_or(-1, |v| v as i64)).collect()
                                });
                                (s.name, s.elem.0, dims)
                            })
                            .collect(),
                    });
                }
                Ok(Control::QueryResult { answers })
            })
            .await
            .map_err(|e| e.to_string())?
        }
        Control::Deploy(spec) => deploy(state, spec, payload, send).await,
        Control::Undeploy { network } => {
            for actor in state.router.remove(network) {
                actor.do_send(Stop);
            }
            Ok(Control::Unloaded { network })
        }
        Control::Cancel { request } => {
            state.router.forget(request);
            Ok(Control::Cancel { request })
        }
        other => Err(format!("a worker does not take {}", other.name())),
    }
}

/// Compiles (or loads from the cache) one subgraph and starts its actor.
#[tracing::instrument(skip_all, fields(network = spec.network, subgraph = spec.subgraph, device = %spec.device))]
async fn deploy(
    state: &Arc<State>,
    spec: DeploySpec,
    model: Bytes,
    send: &mut quinn::SendStream,
) -> Result<Control, String> {
    let limits = *state.node.limits();
    let what = format!(
        "compiling subgraph {} on {}/{}",
        spec.subgraph, state.name, spec.device
    );
    let progress = Control::Progress {
        what: what.clone(),
        done: 0,
        total: 1,
    };
    if let Err(e) = exchange::send_message(send, &progress, None, &limits).await {
        tracing::debug!("reporting progress: {e}");
    }
    let plugin = state.device(&spec.device)?.plugin.clone();
    let cache = state.cache.clone();
    let config = state.config.clone();
    let key = format!("{}-{}", spec.device, spec.model_hash);
    let started = Instant::now();
    let (compiled, cached) = tokio::task::spawn_blocking(move || {
        if let Some(cache) = &cache {
            if let Some(blob) = cache.get(&key) {
                match plugin.import(&blob) {
                    Ok(c) => return Ok((c, true)),
                    Err(e) => tracing::warn!("cached subgraph {key} unusable, recompiling: {e}"),
                }
            }
        }
        let compiled = plugin.compile(&model, &config).map_err(|e| e.to_string())?;
        if let Some(cache) = &cache {
            match compiled.export() {
                Ok(blob) => cache.put(&key, &blob),
                Err(e) => tracing::debug!("not caching {key}: {e}"),
            }
        }
        Ok::<_, String>((compiled, false))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("{what}: {e}"))?;
    let compile_ms = started.elapsed().as_millis() as u64;
    tracing::info!(subgraph = spec.subgraph, device = %spec.device, compile_ms, cached, "deployed");
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
    let actor = SubgraphActor::start_in_arbiter(&state.arbiter, move |_| actor);
    state.router.add(spec.network, &actor, &inputs, routes);
    // Dial the workers this subgraph streams to now, not on the first
    // request.
    for route in &spec.outputs {
        for dest in &route.to {
            if let Destination::Worker { name, addr } = dest {
                if *name != state.name {
                    let (router, name, addr) = (state.router.clone(), name.clone(), addr.clone());
                    tokio::spawn(async move {
                        if let Err(e) = router.peer(&name, &addr).await {
                            tracing::warn!("{e}");
                        }
                    });
                }
            }
        }
    }
    Ok(Control::Deployed {
        network: spec.network,
        subgraph: spec.subgraph,
        compile_ms,
        cached,
    })
}
