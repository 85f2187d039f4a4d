//! A load request prepared for scheduling: its model simplified, the
//! workers asked about it, its graph typed from their answers, and the
//! options (devices, memory, state, previous placement) planning uses.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use tessera_common::affinity::{AnalyticCostModel, DeviceId, DevicePriority, SupportSet};
use tessera_common::graph::Graph;
use tessera_common::onnx::skeleton::skeleton;
use tessera_common::onnx::{decode_model_shared, encode_model};
use tessera_common::plan::{complete_types, prepare, PlanOptions, ReportedType};
use tessera_common::wire::control::LoadRequest;
use tessera_common::wire::Progress;
use tokio::sync::mpsc;

use super::cost::cost_model;
use super::devices::devices;
use super::memory::free_memory;
use super::query::{query_all, ByHost};
use crate::{CoordinatorError, Shared};

/// A load request's model simplified, asked about on every device it may
/// use, typed from the answers, with everything planning needs.
pub(super) struct Prepared {
    pub graph: Graph,
    /// What the workers' QueryNetwork answers found of the tensors' types
    /// (kept with the network: its graph is rebuilt from them).
    pub types: BTreeMap<String, ReportedType>,
    pub by_host: ByHost,
    pub supports: HashMap<DeviceId, SupportSet>,
    pub cost: AnalyticCostModel,
    pub options: PlanOptions,
}

/// Where and for what a load is planned.
#[derive(Default)]
pub(crate) struct Scope<'a> {
    /// Only these workers' devices (a copy's own workers, or those left
    /// after some failed).
    pub only: Option<&'a [String]>,
    /// The network being planned: its own deployments' memory counts as
    /// free.
    pub network: Option<u64>,
    /// The placement it had (node → `host/DEVICE`), kept when it still
    /// fits and predicts nearly as well.
    pub previous: BTreeMap<String, String>,
    /// Where the model was read from ([`crate::network::Origin::source`]):
    /// workers that can read it there take its weights from their own
    /// disk.
    pub source: Option<&'a str>,
}

/// Simplifies the model, asks QueryNetwork of the workers (of the scope's
/// devices; about the model without its weights) and completes the
/// graph's types.
pub(super) async fn prepare_request(
    shared: &Arc<Shared>,
    request: &LoadRequest,
    model: &Bytes,
    progress: &mpsc::Sender<Progress>,
    scope: &Scope<'_>,
) -> Result<Prepared, CoordinatorError> {
    let (only, network) = (scope.only, scope.network);
    let started = std::time::Instant::now();
    // The model's weights stay slices of `model`: held once.
    let proto =
        decode_model_shared(model.clone()).map_err(|e| CoordinatorError::Model(e.to_string()))?;
    let shapes = request_shapes(request);
    // Folding walks the whole model: off the async threads.
    let (graph, simplified) = tokio::task::spawn_blocking(move || prepare(&proto, &shapes))
        .await
        .map_err(|e| CoordinatorError::Plan(format!("simplification failed: {e}")))?
        .map_err(|e| CoordinatorError::Model(e.to_string()))?;
    if !simplified.is_empty() {
        tracing::info!("simplified: {}", simplified.summary());
    }
    // QueryNetwork needs the graph and the weights' types and shapes, not
    // their bytes: a worker is asked about a model bigger than its memory.
    let simplified_ms = started.elapsed().as_millis();
    let bones = Bytes::from(encode_model(&skeleton(graph.model())));
    let devices = devices(shared, &request.devices, only)?;
    let (by_host, answers) = query_all(shared, &devices, &bones, progress).await?;
    tracing::info!(
        simplified_ms,
        queried_ms = started.elapsed().as_millis() - simplified_ms,
        devices = devices.len(),
        "model read, simplified and asked about"
    );
    let types: BTreeMap<String, ReportedType> = answers
        .iter()
        .flat_map(|(_, a)| a.types.iter())
        .map(|t| (t.tensor.clone(), t.found.clone()))
        .collect();
    let (graph, types) = if types.is_empty() {
        (graph, types)
    } else {
        tokio::task::spawn_blocking(move || complete_types(graph, &types).map(|g| (g, types)))
            .await
            .map_err(|e| CoordinatorError::Plan(format!("typing failed: {e}")))?
            .map_err(|e| CoordinatorError::Model(e.to_string()))?
    };
    let supports: HashMap<DeviceId, SupportSet> = answers
        .into_iter()
        .map(|(id, a)| (id, SupportSet::from_nodes(a.supported)))
        .collect();
    let mut manual = BTreeMap::new();
    for (node, device) in &request.affinity {
        let d = DeviceId::parse(device).map_err(|e| CoordinatorError::Devices(e.to_string()))?;
        manual.insert(node.clone(), d);
    }
    let options = PlanOptions {
        priority: DevicePriority {
            devices: devices.iter().map(|(d, _)| d.clone()).collect(),
        },
        policy: request.policy,
        strict: request.strict,
        manual,
        simplified,
        memory: free_memory(shared, &devices, network),
        max_batch: request.batching.map_or(1, |b| u64::from(b.max_batch)),
        state: state_need(&graph, request),
        previous: scope
            .previous
            .iter()
            .filter_map(|(n, d)| Some((n.clone(), DeviceId::parse(d).ok()?)))
            .collect(),
        ..Default::default()
    };
    let cost = cost_model(shared, &devices);
    Ok(Prepared {
        graph,
        types,
        by_host,
        supports,
        cost,
        options,
    })
}

/// What a generative network keeps per stage: each state pair's maker
/// holds its state for the most sequences at their full context.
fn state_need(graph: &Graph, request: &LoadRequest) -> BTreeMap<String, u64> {
    let Some(generation) = &request.generation else {
        return BTreeMap::new();
    };
    let positions =
        u64::from(generation.max_sequences.max(1)) * u64::from(generation.context_length);
    graph.state_need(&graph.state_pairs().unwrap_or_default(), positions)
}

/// A loaded network's graph again, from its model, its request's shapes
/// and the types the workers reported when it was planned: what
/// [`prepare_request`] made of it, without asking the workers (a restarted
/// coordinator rebuilds its networks so). Blocking: walks the whole model.
pub(crate) fn rebuild_graph(
    model: &Bytes,
    request: &LoadRequest,
    types: &BTreeMap<String, ReportedType>,
) -> Result<Graph, CoordinatorError> {
    let proto =
        decode_model_shared(model.clone()).map_err(|e| CoordinatorError::Model(e.to_string()))?;
    let (graph, _) = prepare(&proto, &request_shapes(request))
        .map_err(|e| CoordinatorError::Model(e.to_string()))?;
    if types.is_empty() {
        return Ok(graph);
    }
    complete_types(graph, types).map_err(|e| CoordinatorError::Model(e.to_string()))
}

/// The input shapes a load request fixes.
fn request_shapes(request: &LoadRequest) -> BTreeMap<String, Vec<usize>> {
    request
        .shapes
        .iter()
        .map(|(name, dims)| (name.clone(), dims.iter().map(|&d| d as usize).collect()))
        .collect()
}
