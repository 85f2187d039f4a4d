//! Planning a network: the devices a load names, QueryNetwork fanned out
//! to their workers concurrently, the cost model from the workers' metrics
//! and measured links, then its copies scheduled (one by default; see
//! `tessera_common::schedule`), each with affinity and partition over
//! `host/DEVICE` devices, and the plan document clients get.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use tessera_common::affinity::{
    AnalyticCostModel, DeviceId, DevicePriority, DeviceProfile, LinkProfile, SupportSet,
};
use tessera_common::dump::{plan_report, PlanReport, ReplicaReport};
use tessera_common::graph::Graph;
use tessera_common::onnx::skeleton::skeleton;
use tessera_common::onnx::{decode_model_shared, encode_model};
use tessera_common::plan::{complete_types, prepare, Plan, PlanOptions, ReportedType};
use tessera_common::schedule::predict::stage_costs;
use tessera_common::schedule::{schedule, Cluster, Replicas, Schedule, ScheduleError};
use tessera_common::wire::cluster::{ToWorker, WorkerAnswer};
use tessera_common::wire::control::{DeviceAnswer, LoadRequest};
use tessera_common::wire::{Message, Progress};
use tokio::sync::mpsc;

use crate::workers::WorkerEntry;
use crate::{futures_join, CoordinatorError, Shared};

/// The devices a load request names, each with its worker. Bare kinds
/// (`CPU`) mean that kind on every worker that has it; no devices at all
/// means every device of every worker.
fn devices(
    shared: &Shared,
    spec: &str,
    only: Option<&[String]>,
) -> Result<Vec<(DeviceId, Arc<WorkerEntry>)>, CoordinatorError> {
    let mut workers: Vec<Arc<WorkerEntry>> = shared
        .workers
        .iter()
        .filter(|w| only.is_none_or(|hosts| hosts.contains(&w.name)))
        .filter(|w| !w.draining())
        .map(|w| w.clone())
        .collect();
    workers.sort_by(|a, b| a.name.cmp(&b.name));
    if workers.is_empty() {
        return Err(CoordinatorError::Devices(match only {
            Some(hosts) => format!("none of its workers ({}) is connected", hosts.join(", ")),
            None => "no worker is registered".into(),
        }));
    }
    let known = || {
        workers
            .iter()
            .flat_map(|w| {
                w.devices
                    .iter()
                    .map(move |d| format!("{}/{}", w.name, d.device))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let wanted: Vec<DeviceId> = if spec.trim().is_empty() {
        workers
            .iter()
            .flat_map(|w| {
                w.devices.iter().map(|d| DeviceId {
                    host: Some(w.name.clone()),
                    name: d.device.clone(),
                    index: None,
                })
            })
            .collect()
    } else {
        let priority =
            DevicePriority::parse(spec).map_err(|e| CoordinatorError::Devices(e.to_string()))?;
        let mut out = Vec::new();
        for d in priority.devices {
            if let Some(host) = &d.host {
                // A copy restricted to some workers keeps only theirs.
                if only.is_none_or(|hosts| hosts.contains(host)) {
                    out.push(d);
                }
                continue;
            }
            let matching: Vec<DeviceId> = workers
                .iter()
                .filter(|w| w.devices.iter().any(|x| x.device == d.name))
                .map(|w| DeviceId {
                    host: Some(w.name.clone()),
                    ..d.clone()
                })
                .collect();
            if matching.is_empty() {
                return Err(CoordinatorError::Devices(format!(
                    "no worker has a {} device; the cluster has: {}",
                    d.name,
                    known()
                )));
            }
            out.extend(matching);
        }
        out
    };
    if wanted.is_empty() {
        return Err(CoordinatorError::Devices(format!(
            "none of the devices '{spec}' names is on its workers ({})",
            workers
                .iter()
                .map(|w| w.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    wanted
        .into_iter()
        .map(|d| {
            let host = d.host.clone().unwrap_or_default();
            let worker = workers
                .iter()
                .find(|w| w.name == host && w.devices.iter().any(|x| x.device == d.name))
                .cloned()
                .ok_or_else(|| {
                    CoordinatorError::Devices(format!(
                        "no device {d} in the cluster; it has: {}",
                        known()
                    ))
                })?;
            Ok((d, worker))
        })
        .collect()
}

/// The cost model: each device's reported figures; between hosts, the
/// round-trip time and bandwidth the coordinator measures (each worker's
/// own link: half its round trip, its measured bandwidth).
fn cost_model(shared: &Shared, devices: &[(DeviceId, Arc<WorkerEntry>)]) -> AnalyticCostModel {
    let mut model = AnalyticCostModel::default();
    let mut rtt_us = Vec::new();
    let mut gbps = Vec::new();
    for (id, worker) in devices {
        gbps.extend(worker.bandwidth_gbps());
        if let Some(info) = worker.devices.iter().find(|d| d.device == id.name) {
            if info.gflops > 0.0 && info.bandwidth_gbps > 0.0 {
                let launch_us = model.kinds.get(&id.name).map_or(5.0, |p| p.launch_us);
                model.devices.insert(
                    id.clone(),
                    DeviceProfile {
                        gflops: info.gflops,
                        mem_gbps: info.bandwidth_gbps,
                        launch_us,
                    },
                );
            }
        }
        let rtt = worker.rtt().as_secs_f64() * 1e6;
        rtt_us.push(rtt);
        let link = LinkProfile {
            gbps: worker
                .bandwidth_gbps()
                .unwrap_or(shared.config.inter_host_gbps),
            latency_us: rtt / 2.0,
        };
        model.host_links.insert(worker.name.clone(), link);
    }
    if !rtt_us.is_empty() {
        let mean = rtt_us.iter().sum::<f64>() / rtt_us.len() as f64;
        // Measured bandwidth where known; the configured one otherwise.
        let bandwidth = if gbps.is_empty() {
            shared.config.inter_host_gbps
        } else {
            gbps.iter().sum::<f64>() / gbps.len() as f64
        };
        model.inter_host = LinkProfile {
            gbps: bandwidth,
            latency_us: mean,
        };
    }
    model
}

/// Workers by name, with the device kinds asked of each.
pub(crate) type ByHost = BTreeMap<String, (Arc<WorkerEntry>, Vec<String>)>;

/// QueryNetwork for `devices`, one stream per worker, all at once.
async fn query_all(
    shared: &Arc<Shared>,
    devices: &[(DeviceId, Arc<WorkerEntry>)],
    model: &Bytes,
    progress: &mpsc::Sender<Progress>,
) -> Result<(ByHost, Vec<(DeviceId, DeviceAnswer)>), CoordinatorError> {
    let limits = *shared.node.limits();
    let mut by_host: ByHost = BTreeMap::new();
    for (d, w) in devices {
        let entry = by_host
            .entry(w.name.clone())
            .or_insert_with(|| (w.clone(), Vec::new()));
        if !entry.1.contains(&d.name) {
            entry.1.push(d.name.clone());
        }
    }
    let queries = by_host.values().map(|(w, kinds)| {
        let msg = ToWorker::QueryNetwork {
            devices: kinds.clone(),
            epoch: w.epoch,
        };
        async move {
            let _ = progress
                .send(Progress {
                    what: format!("QueryNetwork on {}", w.name),
                    done: 0,
                    total: 1,
                })
                .await;
            let answer = w.ask(&limits, &msg, Some(model), None).await?;
            match answer {
                WorkerAnswer::QueryResult { answers } => Ok((w.name.clone(), answers)),
                other => Err(CoordinatorError::Worker(format!(
                    "worker {} answered QueryNetwork with {}",
                    w.name,
                    other.name()
                ))),
            }
        }
    });
    let mut out = Vec::new();
    for (host, answers) in futures_join(queries).await? {
        for a in answers {
            let id = devices
                .iter()
                .map(|(d, _)| d)
                .find(|d| d.host.as_deref() == Some(host.as_str()) && d.name == a.device);
            if let Some(id) = id {
                out.push((id.clone(), a));
            }
        }
    }
    Ok((by_host, out))
}

/// Which nodes each `host/DEVICE` of `spec` supports (a client's
/// `tessera query`); answers are named `host/DEVICE`.
pub async fn query(
    shared: &Arc<Shared>,
    spec: &str,
    model: Bytes,
    progress: mpsc::Sender<Progress>,
) -> Result<Vec<DeviceAnswer>, CoordinatorError> {
    let proto = decode_model_shared(model).map_err(|e| CoordinatorError::Model(e.to_string()))?;
    let bones = Bytes::from(encode_model(&skeleton(&proto)));
    let devices = devices(shared, spec, None)?;
    let (_, answers) = query_all(shared, &devices, &bones, &progress).await?;
    Ok(answers
        .into_iter()
        .map(|(id, a)| DeviceAnswer {
            device: id.to_string(),
            ..a
        })
        .collect())
}

/// A load request's model simplified, asked about on every device it may
/// use, typed from the answers, with everything planning needs.
struct Prepared {
    graph: Graph,
    /// What the workers' QueryNetwork answers found of the tensors' types
    /// (kept with the network: its graph is rebuilt from them).
    types: BTreeMap<String, ReportedType>,
    by_host: ByHost,
    supports: HashMap<DeviceId, SupportSet>,
    cost: AnalyticCostModel,
    options: PlanOptions,
}

/// What the networks deployed now need on each device (`host/DEVICE`),
/// but network `except`'s (being planned again), bytes.
pub(crate) fn memory_in_use(shared: &Shared, except: Option<u64>) -> HashMap<String, u64> {
    memory_needs(shared, except)
        .into_iter()
        .map(|(device, need)| (device, need.total()))
        .collect()
}

/// [`memory_in_use`] as weights, activations and state.
pub(crate) fn memory_needs(
    shared: &Shared,
    except: Option<u64>,
) -> HashMap<String, tessera_common::memory::MemoryNeed> {
    let mut used: HashMap<String, tessera_common::memory::MemoryNeed> = HashMap::new();
    for loaded in shared.networks.iter() {
        if Some(loaded.id) == except {
            continue;
        }
        for deployed in loaded.deployments() {
            for d in &deployed.plan.memory.devices {
                *used.entry(d.device.clone()).or_default() += d.need;
            }
        }
    }
    used
}

/// What each device may still take: what it offers (its worker's limit,
/// else what it has) less what deployed networks other than `except`
/// need there. Devices that report nothing are not limited.
fn free_memory(
    shared: &Shared,
    devices: &[(DeviceId, Arc<WorkerEntry>)],
    except: Option<u64>,
) -> HashMap<DeviceId, u64> {
    let used = memory_in_use(shared, except);
    devices
        .iter()
        .filter_map(|(id, w)| {
            let info = w.devices.iter().find(|d| d.device == id.name)?;
            let taken = used.get(&id.to_string()).copied().unwrap_or(0);
            (info.memory_bytes > 0).then(|| (id.clone(), info.memory_bytes.saturating_sub(taken)))
        })
        .collect()
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
}

/// Simplifies the model, asks QueryNetwork of the workers (of the scope's
/// devices; about the model without its weights) and completes the
/// graph's types.
async fn prepare_request(
    shared: &Arc<Shared>,
    request: &LoadRequest,
    model: &Bytes,
    progress: &mpsc::Sender<Progress>,
    scope: &Scope<'_>,
) -> Result<Prepared, CoordinatorError> {
    let (only, network) = (scope.only, scope.network);
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
    let bones = Bytes::from(encode_model(&skeleton(graph.model())));
    let devices = devices(shared, &request.devices, only)?;
    let (by_host, answers) = query_all(shared, &devices, &bones, progress).await?;
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

/// A load request's copies, each planned.
pub(crate) struct Scheduled {
    pub graph: Arc<Graph>,
    /// The tensors' types the workers reported (see [`rebuild_graph`]).
    pub types: BTreeMap<String, ReportedType>,
    pub by_host: ByHost,
    pub cost: AnalyticCostModel,
    pub schedule: Schedule,
}

impl Scheduled {
    /// Copy `i` as one plan to deploy.
    pub fn copy(&self, i: usize) -> Planned<'_> {
        Planned {
            graph: &self.graph,
            by_host: &self.by_host,
            plan: &self.schedule.copies[i].plan,
            cost: &self.cost,
        }
    }
}

/// Plans `replicas` copies of `model` as asked, over the workers connected
/// now, within `scope`.
#[tracing::instrument(level = "debug", skip_all, fields(name = %request.name))]
pub(crate) async fn plan_request(
    shared: &Arc<Shared>,
    request: &LoadRequest,
    model: &Bytes,
    progress: &mpsc::Sender<Progress>,
    replicas: Replicas,
    scope: &Scope<'_>,
) -> Result<Scheduled, CoordinatorError> {
    let prepared = prepare_request(shared, request, model, progress, scope).await?;
    // Affinity, partition and export of every copy walk the whole model:
    // off the async threads too.
    let (prepared, schedule) = tokio::task::spawn_blocking(move || {
        let cluster = Cluster {
            graph: &prepared.graph,
            supports: &prepared.supports,
            cost: &prepared.cost,
        };
        let schedule = schedule(&cluster, &prepared.options, replicas);
        (prepared, schedule)
    })
    .await
    .map_err(|e| CoordinatorError::Plan(format!("planning failed: {e}")))?;
    let schedule = schedule.map_err(|e| match e {
        ScheduleError::Copy {
            count: 1, source, ..
        } => CoordinatorError::Plan(source.to_string()),
        e => CoordinatorError::Plan(e.to_string()),
    })?;
    if schedule.copies.len() > 1 {
        tracing::info!(
            copies = schedule.copies.len(),
            predicted_rps = schedule.predicted_rps.round(),
            "replicas scheduled"
        );
    }
    Ok(Scheduled {
        graph: Arc::new(prepared.graph),
        types: prepared.types,
        by_host: prepared.by_host,
        cost: prepared.cost,
        schedule,
    })
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

/// One planned copy, as it is deployed.
pub(crate) struct Planned<'a> {
    pub graph: &'a Arc<Graph>,
    pub by_host: &'a ByHost,
    pub plan: &'a Plan,
    pub cost: &'a AnalyticCostModel,
}

/// A copy's plan document: the partition's [`PlanReport`], with per
/// subgraph its host, its predicted compute time and the predicted
/// transfer time of its inputs.
pub(crate) fn plan_report_of(p: &Planned, network: u64, hosts: &[String]) -> PlanReport {
    let (graph, planned) = (p.graph, p.plan);
    let part = &planned.partition;
    let mut report = plan_report(graph, &planned.assignment, part);
    let costs = stage_costs(graph, planned, p.cost);
    for ((sg, out), cost) in part.subgraphs.iter().zip(&mut report.subgraphs).zip(costs) {
        out.host = part.device_of(sg).host.clone();
        // JSON has no NaN or infinity: an estimate that is not finite is
        // reported as 0 (not predicted).
        let finite = |v: f64| if v.is_finite() { v.round() } else { 0.0 };
        out.predicted_compute_us = finite(cost.compute_us);
        out.predicted_transfer_us = finite(cost.transfer_us);
    }
    report.network = network;
    report.hosts = hosts.to_vec();
    report.simplified = planned.simplified.clone();
    for (out, need) in report.subgraphs.iter_mut().zip(&planned.memory.subgraphs) {
        out.memory = *need;
    }
    report.memory = planned.memory.clone();
    report
}

/// The workers a plan runs on, sorted, each once.
pub(crate) fn hosts_of(plan: &Plan) -> Vec<String> {
    let mut hosts: Vec<String> = plan
        .stages
        .iter()
        .filter_map(|s| s.device.host.clone())
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// Plans `model` as asked without deploying it; returns the plan: the
/// first copy's, every copy listed when there are several.
pub async fn dry_run(
    shared: &Arc<Shared>,
    request: LoadRequest,
    model: Bytes,
    progress: mpsc::Sender<Progress>,
) -> Result<PlanReport, CoordinatorError> {
    let scheduled = plan_request(
        shared,
        &request,
        &model,
        &progress,
        request.replicas,
        &Scope::default(),
    )
    .await?;
    let copies = &scheduled.schedule.copies;
    let first = scheduled.copy(0);
    let mut report = plan_report_of(&first, 0, &hosts_of(first.plan));
    if copies.len() > 1 {
        report.replicas = copies
            .iter()
            .map(|c| ReplicaReport {
                deployment: 0,
                hosts: hosts_of(&c.plan),
                devices: c.plan.stages.iter().map(|s| s.device.to_string()).collect(),
                predicted_latency_us: c.cost.latency_us.round(),
                predicted_rps: c.cost.throughput_rps(),
                measured: Vec::new(),
            })
            .collect();
    }
    report.predicted_rps = scheduled.schedule.predicted_rps;
    report.considered = scheduled.schedule.considered.clone();
    Ok(report)
}
