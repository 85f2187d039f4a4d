//! Loading a network: QueryNetwork fanned out to the workers concurrently,
//! affinity and partition over `host/DEVICE` devices, then every subgraph
//! exported and deployed in parallel (progress forwarded to the client).
//! A failed deployment undeploys what was deployed.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tessera_common::affinity::CostModel;
use tessera_common::affinity::{
    AnalyticCostModel, DeviceId, DevicePriority, DeviceProfile, LinkProfile, Policy, SupportSet,
};
use tessera_common::graph::{Dim, Graph};
use tessera_common::onnx::{decode_model, encode_model};
use tessera_common::plan::{complete_types, io_names, plan, prepare, PlanOptions, ReportedType};
use tessera_common::wire::control::{
    Control, DeploySpec, Destination, DeviceAnswer, LoadRequest, Route,
};
use tessera_common::wire::Frame;
use tessera_net::{recv_frame, send_frame};
use tokio::sync::mpsc;

use crate::heal::Loaded;
use crate::members::WorkerEntry;
use crate::{CoordinatorError, Shared};

/// Where one subgraph runs.
#[derive(Debug, Clone)]
pub struct Placement {
    pub host: String,
    pub device: String,
    pub nodes: usize,
}

/// One deployment of a loaded network (a network lost a worker gets a new
/// one, see [`crate::heal`]).
pub struct Deployed {
    /// The deployment's id: the network id on the wire to workers.
    pub id: u64,
    /// The network's id, as clients know it.
    pub network: u64,
    pub name: String,
    pub graph: Graph,
    pub outputs: Vec<String>,
    /// Graph input → workers that read it.
    pub input_routes: Vec<(String, Vec<String>)>,
    /// Workers with subgraphs that have no inputs (sent a trigger per
    /// request).
    pub trigger_hosts: Vec<String>,
    /// Every worker it runs on.
    pub hosts: Vec<String>,
    pub placements: Vec<Placement>,
    /// The plan as JSON (subgraphs, affinity, explanations, hosts).
    pub plan: String,
}

/// One operation on its own stream to a worker: sends `msg` (with
/// `payload`), forwards `Progress` frames, returns the final answer.
async fn ask(
    shared: &Shared,
    worker: &WorkerEntry,
    msg: &Control,
    payload: Option<&Bytes>,
    progress: Option<&mpsc::Sender<Control>>,
) -> Result<Control, CoordinatorError> {
    let limits = *shared.node.limits();
    let failed = |e: String| CoordinatorError::Worker(format!("worker {}: {e}", worker.name));
    let (mut send, mut recv) = worker
        .connection
        .open_bi()
        .await
        .map_err(|e| failed(e.to_string()))?;
    let len = payload.map_or(0, |p| p.len() as u64);
    let head = msg
        .encode(len, &limits)
        .map_err(|e| failed(e.to_string()))?;
    send_frame(&mut send, &head, payload)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let _ = send.finish();
    loop {
        match recv_frame(&mut recv, &limits).await {
            Ok(Some(Frame::Control(p @ Control::Progress { .. }, _))) => {
                if let Some(tx) = progress {
                    let _ = tx.send(p).await;
                }
            }
            Ok(Some(Frame::Control(Control::Failed { error, .. }, _))) => {
                return Err(failed(error))
            }
            Ok(Some(Frame::Control(answer, _))) => return Ok(answer),
            Ok(Some(other)) => return Err(failed(format!("unexpected {:?} frame", other.kind()))),
            Ok(None) => return Err(failed("closed the stream without an answer".into())),
            Err(e) => return Err(failed(e.to_string())),
        }
    }
}

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
struct Planned {
    graph: Graph,
    by_host: ByHost,
    plan: tessera_common::plan::Plan,
    cost: AnalyticCostModel,
}

/// Workers by name, with the device kinds asked of each.
type ByHost = BTreeMap<String, (Arc<WorkerEntry>, Vec<String>)>;

/// QueryNetwork for `devices`, one stream per worker, all at once.
async fn query_all(
    shared: &Arc<Shared>,
    devices: &[(DeviceId, Arc<WorkerEntry>)],
    model: &Bytes,
    progress: &mpsc::Sender<Control>,
) -> Result<(ByHost, Vec<(DeviceId, DeviceAnswer)>), CoordinatorError> {
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
            let answer = ask(shared, w, &msg, Some(model), None).await?;
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

async fn plan_request(
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
    let policy: Policy = request
        .policy
        .parse()
        .map_err(|e: String| CoordinatorError::Plan(e))?;
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

/// The plan as JSON: the partition dump, plus per subgraph its host, its
/// predicted compute time and the predicted transfer time of its inputs.
fn plan_json(p: &Planned, network: u64, hosts: &[String]) -> String {
    let (graph, planned) = (&p.graph, &p.plan);
    let part = &planned.partition;
    let mut json = tessera_common::dump::subgraphs_json(graph, &planned.assignment, part);
    if let Some(subgraphs) = json["subgraphs"].as_array_mut() {
        for (sg, v) in part.subgraphs.iter().zip(subgraphs) {
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
                    let from = part.subgraph_of[producer.index()]
                        .map(|i| part.device_of(&part.subgraphs[i]));
                    let bytes = tessera_common::affinity::tensor_bytes(graph, t);
                    from.map_or(0.0, |from| p.cost.transfer_us(bytes, from, device))
                })
                .sum();
            if let Some(obj) = v.as_object_mut() {
                obj.insert("host".into(), serde_json::json!(device.host));
                obj.insert(
                    "predicted_compute_us".into(),
                    serde_json::json!(compute.round()),
                );
                obj.insert(
                    "predicted_transfer_us".into(),
                    serde_json::json!(transfer.round()),
                );
            }
        }
    }
    if let Some(obj) = json.as_object_mut() {
        obj.insert("network".into(), serde_json::json!(network));
        obj.insert("hosts".into(), serde_json::json!(hosts));
        obj.insert(
            "simplified".into(),
            serde_json::to_value(&planned.simplified).unwrap_or_default(),
        );
    }
    json.to_string()
}

fn hosts_of(planned: &Planned) -> Vec<String> {
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

/// Loads `model` as asked; returns the loaded network (its id and plan).
pub async fn load_network(
    shared: &Arc<Shared>,
    request: LoadRequest,
    model: Bytes,
    progress: mpsc::Sender<Control>,
) -> Result<Arc<Loaded>, CoordinatorError> {
    let network = shared.next_network.fetch_add(1, Ordering::Relaxed);
    let deployed = deploy(shared, network, &request, &model, progress).await?;
    let loaded = Arc::new(Loaded::new(request, model, deployed));
    shared.networks.insert(network, loaded.clone());
    tracing::info!(network, "network loaded");
    Ok(loaded)
}

/// Plans `model` as asked over the workers connected now and deploys it as
/// a new deployment of network `network`.
pub async fn deploy(
    shared: &Arc<Shared>,
    network: u64,
    request: &LoadRequest,
    model: &Bytes,
    progress: mpsc::Sender<Control>,
) -> Result<Arc<Deployed>, CoordinatorError> {
    let planned_request = plan_request(shared, request, model, &progress).await?;
    let (graph, by_host, planned) = (
        &planned_request.graph,
        &planned_request.by_host,
        &planned_request.plan,
    );
    let deployment = shared.next_network.fetch_add(1, Ordering::Relaxed);
    let host_of = |d: &DeviceId| d.host.clone().unwrap_or_default();
    let worker_of = |h: &str| by_host.get(h).map(|(w, _)| w.clone());
    let (input_names, output_names) = io_names(graph);

    // Routes: each output to the workers whose subgraphs read it, and to
    // the coordinator when it is a graph output.
    let mut specs = Vec::new();
    for (i, stage) in planned.stages.iter().enumerate() {
        let outputs = stage
            .outputs
            .iter()
            .map(|t| {
                let mut to: Vec<Destination> = Vec::new();
                for other in &planned.stages {
                    if other.inputs.contains(t) {
                        let host = host_of(&other.device);
                        let addr = worker_of(&host)
                            .map(|w| w.data_addr.clone())
                            .unwrap_or_default();
                        let dest = Destination::Worker { name: host, addr };
                        if !to.contains(&dest) {
                            to.push(dest);
                        }
                    }
                }
                if output_names.contains(t) {
                    to.push(Destination::Coordinator);
                }
                Route {
                    tensor: t.clone(),
                    to,
                }
            })
            .collect();
        let bytes = Bytes::from(encode_model(&stage.model));
        let spec = DeploySpec {
            network: deployment,
            subgraph: i as u32,
            device: stage.device.name.clone(),
            model_hash: hex(&Sha256::digest(&bytes)),
            inputs: stage.inputs.clone(),
            outputs,
        };
        specs.push((host_of(&stage.device), spec, bytes));
    }
    let input_routes = input_names
        .iter()
        .map(|name| {
            let mut hosts: Vec<String> = Vec::new();
            for s in &planned.stages {
                let h = host_of(&s.device);
                if s.inputs.contains(name) && !hosts.contains(&h) {
                    hosts.push(h);
                }
            }
            (name.clone(), hosts)
        })
        .collect();
    // Subgraphs without inputs (constants only) run on a per-request
    // trigger sent to their hosts.
    let mut trigger_hosts: Vec<String> = Vec::new();
    for s in &planned.stages {
        let h = host_of(&s.device);
        if s.inputs.is_empty() && !trigger_hosts.contains(&h) {
            trigger_hosts.push(h);
        }
    }
    let mut hosts: Vec<String> = specs.iter().map(|(h, _, _)| h.clone()).collect();
    hosts.sort();
    hosts.dedup();

    // Deploy, all subgraphs at once.
    let total = specs.len() as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let deploys = specs.iter().map(|(host, spec, bytes)| {
        let progress = progress.clone();
        let done = &done;
        async move {
            let worker = worker_of(host)
                .ok_or_else(|| CoordinatorError::Worker(format!("worker {host} is gone")))?;
            let msg = Control::Deploy(spec.clone());
            match ask(shared, &worker, &msg, Some(bytes), Some(&progress)).await? {
                Control::Deployed { .. } => {
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    let _ = progress
                        .send(Control::Progress {
                            what: "deployed subgraphs".into(),
                            done: n,
                            total,
                        })
                        .await;
                    Ok(())
                }
                other => Err(CoordinatorError::Worker(format!(
                    "worker {host} answered Deploy with {}",
                    other.name()
                ))),
            }
        }
    });
    if let Err(e) = futures_join(deploys).await {
        undeploy(shared, deployment, &hosts).await;
        return Err(e);
    }

    let placements: Vec<Placement> = planned
        .stages
        .iter()
        .map(|s| Placement {
            host: host_of(&s.device),
            device: s.device.name.clone(),
            nodes: s.nodes,
        })
        .collect();
    let plan = plan_json(&planned_request, network, &hosts);
    let deployed = Arc::new(Deployed {
        id: deployment,
        network,
        name: request.name.clone(),
        graph: graph.clone(),
        outputs: output_names,
        input_routes,
        trigger_hosts,
        hosts,
        placements,
        plan,
    });
    tracing::info!(network, deployment, subgraphs = total, "network deployed");
    Ok(deployed)
}

/// Stops a deployment's subgraphs on its workers that are still connected.
pub async fn undeploy(shared: &Arc<Shared>, network: u64, hosts: &[String]) {
    for host in hosts {
        let Some(worker) = shared.workers.get(host).map(|w| w.clone()) else {
            continue;
        };
        if let Err(e) = ask(shared, &worker, &Control::Undeploy { network }, None, None).await {
            tracing::warn!("undeploy network {network}: {e}");
        }
    }
}

/// Unloads a network.
pub async fn unload(shared: &Arc<Shared>, network: u64) -> Result<(), CoordinatorError> {
    let (_, loaded) = shared
        .networks
        .remove(&network)
        .ok_or(CoordinatorError::UnknownNetwork(network))?;
    shared.repository.network_unloaded(network);
    if let Some(deployed) = loaded.deployed() {
        undeploy(shared, deployed.id, &deployed.hosts).await;
    }
    Ok(())
}

/// Runs futures concurrently until every one has finished; then the first
/// error in the given order, if any, is the result.
async fn futures_join<T, F>(futures: impl Iterator<Item = F>) -> Result<Vec<T>, CoordinatorError>
where
    F: std::future::Future<Output = Result<T, CoordinatorError>>,
{
    let all: Vec<Result<T, CoordinatorError>> = futures_util::future::join_all(futures).await;
    all.into_iter().collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
