//! What the repository shows of its models: each one's status (ready,
//! loading, unavailable with why, unloaded), the network serving one, its
//! graph for metadata, and which workers its request names are absent.

use std::sync::Arc;

use bytes::Bytes;
use tessera_common::affinity::{DeviceId, DevicePriority};
use tessera_common::graph::Graph;
use tessera_common::onnx::decode_model_shared;
use tessera_common::wire::control::{LoadRequest, ModelState, ModelStatus};

use super::files::read;
use super::registry::Entry;
use crate::network::{Current, Loaded};
use crate::{CoordinatorError, Shared};

/// The status of every named model, sorted by name.
pub fn statuses(shared: &Shared) -> Vec<ModelStatus> {
    shared
        .repository
        .names()
        .iter()
        .filter_map(|n| shared.repository.get(n))
        .map(|e| status(shared, &e))
        .collect()
}

/// One model's status: ready, loading, unavailable (with why) or
/// unloaded.
pub fn status(shared: &Shared, entry: &Entry) -> ModelStatus {
    let s = entry.lock();
    let absent = absent_workers(shared, &s.request);
    let loaded = s
        .network
        .and_then(|n| shared.networks.get(&n).map(|l| l.clone()));
    let (state, reason) = match loaded.as_ref().map(|l| l.current()) {
        Some(Current::Ready(_)) => (
            ModelState::Ready,
            loaded.and_then(|l| lacking(&l)).unwrap_or_default(),
        ),
        Some(Current::Healing(_)) => (
            ModelState::Loading,
            "re-planning after a worker loss".into(),
        ),
        Some(Current::Broken(why)) => (ModelState::Unavailable, why),
        None if !s.wanted => (ModelState::Unloaded, String::new()),
        None if s.loading => (ModelState::Loading, String::new()),
        None if shared.workers.is_empty() => {
            (ModelState::Unavailable, "no worker is registered".into())
        }
        None if s.failure.is_none() && !absent.is_empty() => (
            ModelState::Unavailable,
            format!("waiting for workers {}", absent.join(", ")),
        ),
        None => (
            ModelState::Unavailable,
            s.failure.as_ref().map(|f| f.0.clone()).unwrap_or_default(),
        ),
    };
    ModelStatus {
        name: entry.name.clone(),
        state,
        network: s.network.unwrap_or(0),
        reason,
    }
}

/// What a network restored without its model's bytes lacks (it serves
/// meanwhile).
fn lacking(loaded: &Loaded) -> Option<String> {
    let bones = loaded.lacking()?;
    let weights = bones.weights();
    let bytes: u64 = weights.iter().map(|(_, b)| b).sum();
    Some(format!(
        "serving; this coordinator lacks the model's bytes ({} weights, {:.1} MiB) and takes \
         them back from the workers before it can plan it again",
        weights.len(),
        bytes as f64 / (1u64 << 20) as f64
    ))
}

/// The network that serves model `name` now.
pub fn serving(shared: &Shared, name: &str) -> Result<Arc<Loaded>, CoordinatorError> {
    let entry = shared
        .repository
        .get(name)
        .ok_or_else(|| CoordinatorError::UnknownModel(name.into()))?;
    let loaded = entry
        .network()
        .and_then(|n| shared.networks.get(&n).map(|l| l.clone()));
    match loaded {
        Some(l) => Ok(l),
        None => {
            let st = status(shared, &entry);
            let why = if st.reason.is_empty() {
                st.state.as_str().to_lowercase()
            } else {
                format!("{}: {}", st.state.as_str().to_lowercase(), st.reason)
            };
            Err(CoordinatorError::NotReady(format!(
                "model {name} is not loaded ({why})"
            )))
        }
    }
}

/// The graph of model `name` (its loaded network's, else read from its
/// source), for metadata.
pub async fn graph(shared: &Shared, name: &str) -> Result<Arc<Graph>, CoordinatorError> {
    let entry = shared
        .repository
        .get(name)
        .ok_or_else(|| CoordinatorError::UnknownModel(name.into()))?;
    let source = {
        let s = entry.lock();
        if let Some(g) = &s.graph {
            return Ok(g.clone());
        }
        s.source.clone()
    };
    let bytes = read(&source).await?;
    let graph = tokio::task::spawn_blocking(move || parse(bytes))
        .await
        .map_err(|e| CoordinatorError::Model(e.to_string()))??;
    let graph = Arc::new(graph);
    entry.lock().graph = Some(graph.clone());
    Ok(graph)
}

/// The graph of `bytes`, its weights slices of them (not copies).
fn parse(bytes: Bytes) -> Result<Graph, CoordinatorError> {
    let model = decode_model_shared(bytes).map_err(|e| CoordinatorError::Model(e.to_string()))?;
    Graph::from_model(model).map_err(|e| CoordinatorError::Model(e.to_string()))
}

/// Workers that `request`'s devices or manual pins name and that are not
/// registered now.
pub(super) fn absent_workers(shared: &Shared, request: &LoadRequest) -> Vec<String> {
    let mut named: Vec<String> = Vec::new();
    if let Ok(priority) = DevicePriority::parse(&request.devices) {
        named.extend(priority.devices.iter().filter_map(|d| d.host.clone()));
    }
    for (_, device) in &request.affinity {
        if let Ok(d) = DeviceId::parse(device) {
            named.extend(d.host);
        }
    }
    named.sort();
    named.dedup();
    named.retain(|h| !shared.workers.contains_key(h));
    named
}

/// The registered workers' names, sorted.
pub(super) fn worker_names(shared: &Shared) -> Vec<String> {
    let mut names: Vec<String> = shared.workers.iter().map(|w| w.key().clone()).collect();
    names.sort();
    names
}
