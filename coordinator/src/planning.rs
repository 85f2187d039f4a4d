//! Planning a network: the devices a load names, QueryNetwork fanned out
//! to their workers concurrently, the cost model from the workers' metrics
//! and measured links, then affinity and partition over `host/DEVICE`
//! devices, and the plan document clients get.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use tessera_common::affinity::CostModel;
use tessera_common::affinity::{
    AnalyticCostModel, DeviceId, DevicePriority, DeviceProfile, LinkProfile, SupportSet,
};
use tessera_common::dump::plan_report;
use tessera_common::graph::{Dim, Graph};
use tessera_common::onnx::{decode_model, encode_model};
use tessera_common::plan::{complete_types, plan, prepare, PlanOptions, ReportedType};
use tessera_common::wire::control::{Control, DeviceAnswer, LoadRequest};
use tokio::sync::mpsc;

use crate::workers::WorkerEntry;
use crate::{futures_join, CoordinatorError, Shared};

/// The devices a load request names, each with its worker. Bare kinds
/// (`CPU`) mean that kind on every worker that has it; no devices at all
/// means every device of every worker.
fn devices(
    shared: &Shared,
    spec: &str,
) -> Result<Vec<(DeviceId, Arc<WorkerEntry>)>, CoordinatorError> {
    let mut workers: Vec<Arc<WorkerEntry>> = shared.workers.iter().map(|w| w.clone()).collect();
    workers.sort_by(|a, b| a.name.cmp(&b.name));
    if workers.is_empty() {
        return Err(CoordinatorError::Devices("no worker is registered".into()));
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
            if d.host.is_some() {
                out.push(d);
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
/// round-trip time and bandwidth the coordinator measures.
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
        rtt_us.push(worker.rtt().as_secs_f64() * 1e6);
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

/// The devices of a request, their QueryNetwork answers (asked of every
/// worker at once), and the plan.
pub(crate) struct Planned {
    pub graph: Graph,
    pub by_host: ByHost,
    pub plan: tessera_common::plan::Plan,
    pub cost: AnalyticCostModel,
}

/// Workers by name, with the device kinds asked of each.
pub(crate) type ByHost = BTreeMap<String, (Arc<WorkerEntry>, Vec<String>)>;

/// QueryNetwork for `devices`, one stream per worker, all at once.
async fn query_all(
    shared: &Arc<Shared>,
    devices: &[(DeviceId, Arc<WorkerEntry>)],
    model: &Bytes,
    progress: &mpsc::Sender<Control>,
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
        let msg = Control::QueryNetwork {
            devices: kinds.clone(),
        };
        async move {
            let _ = progress
                .send(Control::Progress {
                    what: format!("QueryNetwork on {}", w.name),
                    done: 0,
                    total: 1,
                })
                .await;
            let answer = w.ask(&limits, &msg, Some(model), None).await?;
            match answer {
                Control::QueryResult { answers } => Ok((w.name.clone(), answers)),
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
    progress: mpsc::Sender<Control>,
) -> Result<Vec<DeviceAnswer>, CoordinatorError> {
    decode_model(&model).map_err(|e| CoordinatorError::Model(e.to_string()))?;
    let devices = devices(shared, spec)?;
    let (_, answers) = query_all(shared, &devices, &model, &progress).await?;
    Ok(answers
        .into_iter()
        .map(|(id, a)| DeviceAnswer {
            device: id.to_string(),
            ..a
        })
        .collect())
}

#[tracing::instrument(level = "debug", skip_all, fields(name = %request.name))]
pub(crate) async fn plan_request(
    shared: &Arc<Shared>,
    request: &LoadRequest,
    model: &Bytes,
    progress: &mpsc::Sender<Control>,
) -> Result<Planned, CoordinatorError> {
    let proto = decode_model(model).map_err(|e| CoordinatorError::Model(e.to_string()))?;
    let shapes: BTreeMap<String, Vec<usize>> = request
        .shapes
        .iter()
        .map(|(name, dims)| (name.clone(), dims.iter().map(|&d| d as usize).collect()))
        .collect();
    // Folding walks the whole model: off the async threads.
    let (graph, simplified) = tokio::task::spawn_blocking(move || prepare(&proto, &shapes))
        .await
        .map_err(|e| CoordinatorError::Plan(format!("simplification failed: {e}")))?
        .map_err(|e| CoordinatorError::Model(e.to_string()))?;
    if !simplified.is_empty() {
        tracing::info!("simplified: {}", simplified.summary());
    }
    let simplified_bytes = Bytes::from(encode_model(graph.model()));
    let devices = devices(shared, &request.devices)?;
    let (by_host, answers) = query_all(shared, &devices, &simplified_bytes, progress).await?;
    let types: BTreeMap<String, ReportedType> = answers
        .iter()
        .flat_map(|(_, a)| a.types.iter())
        .map(|(t, e, dims)| {
            let reported = ReportedType {
                elem: (*e != 0).then_some(tessera_common::onnx::ElemType(*e)),
                shape: dims.as_ref().map(|d| {
                    d.iter()
                        .map(|&v| if v >= 0 { Dim::Known(v) } else { Dim::Unknown })
                        .collect()
                }),
            };
            (t.clone(), reported)
        })
        .collect();
    let graph = if types.is_empty() {
        graph
    } else {
        tokio::task::spawn_blocking(move || complete_types(graph, &types))
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
    let policy = request.policy;
    let options = PlanOptions {
        priority: DevicePriority {
            devices: devices.iter().map(|(d, _)| d.clone()).collect(),
        },
        policy,
        strict: request.strict,
        manual,
        simplified,
        ..Default::default()
    };
    let cost = cost_model(shared, &devices);
    // Affinity, partition and export walk the whole model: off the async
    // threads too.
    let (graph, cost, plan) = tokio::task::spawn_blocking(move || {
        let plan = plan(&graph, &supports, &cost, &options);
        (graph, cost, plan)
    })
    .await
    .map_err(|e| CoordinatorError::Plan(format!("planning failed: {e}")))?;
    let plan = plan.map_err(|e| CoordinatorError::Plan(e.to_string()))?;
    Ok(Planned {
        graph,
        by_host,
        plan,
        cost,
    })
}

/// The plan as JSON: the partition's [`PlanReport`], with per subgraph its
/// host, its predicted compute time and the predicted transfer time of its
/// inputs.
pub(crate) fn plan_json(p: &Planned, network: u64, hosts: &[String]) -> String {
    let (graph, planned) = (&p.graph, &p.plan);
    let part = &planned.partition;
    let mut report = plan_report(graph, &planned.assignment, part);
    for (sg, out) in part.subgraphs.iter().zip(&mut report.subgraphs) {
        let device = part.device_of(sg);
        let compute: f64 = sg
            .nodes
            .iter()
            .map(|&n| p.cost.compute_us(graph, n, device))
            .sum();
        let transfer: f64 = sg
            .inputs
            .iter()
            .map(|&t| {
                let producer = graph.tensor(t).producer;
                let from =
                    part.subgraph_of[producer.index()].map(|i| part.device_of(&part.subgraphs[i]));
                let bytes = tessera_common::affinity::tensor_bytes(graph, t);
                from.map_or(0.0, |from| p.cost.transfer_us(bytes, from, device))
            })
            .sum();
        out.host = device.host.clone();
        // JSON has no NaN or infinity: an estimate that is not finite is
        // reported as 0 (not predicted).
        let finite = |v: f64| if v.is_finite() { v.round() } else { 0.0 };
        out.predicted_compute_us = finite(compute);
        out.predicted_transfer_us = finite(transfer);
    }
    report.network = network;
    report.hosts = hosts.to_vec();
    report.simplified = planned.simplified.clone();
    // Plain structs of strings and numbers: serializing cannot fail.
    serde_json::to_string(&report).unwrap_or_default()
}

pub(crate) fn hosts_of(planned: &Planned) -> Vec<String> {
    let mut hosts: Vec<String> = planned
        .plan
        .stages
        .iter()
        .filter_map(|s| s.device.host.clone())
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// Plans `model` as asked without deploying it; returns the plan (JSON).
pub async fn dry_run(
    shared: &Arc<Shared>,
    request: LoadRequest,
    model: Bytes,
    progress: mpsc::Sender<Control>,
) -> Result<String, CoordinatorError> {
    let planned = plan_request(shared, &request, &model, &progress).await?;
    Ok(plan_json(&planned, 0, &hosts_of(&planned)))
}
