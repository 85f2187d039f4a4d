//! Deploying a planned network: every subgraph exported and shipped to its
//! worker in parallel (progress forwarded to the client), routes from each
//! output to its readers; a failed deployment undeploys what was deployed.
//! Also unloading.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tessera_common::affinity::DeviceId;
use tessera_common::onnx::encode_model;
use tessera_common::plan::{io_names, Stage};
use tessera_common::wire::control::{Control, DeploySpec, Destination, LoadRequest, Route};
use tokio::sync::mpsc;

use crate::network::{Deployed, Loaded, Placement};
use crate::planning::{hosts_of, plan_json, plan_request, ByHost, Planned};
use crate::{futures_join, CoordinatorError, Shared};

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
#[tracing::instrument(skip_all, fields(network = network, name = %request.name))]
pub async fn deploy(
    shared: &Arc<Shared>,
    network: u64,
    request: &LoadRequest,
    model: &Bytes,
    progress: mpsc::Sender<Control>,
) -> Result<Arc<Deployed>, CoordinatorError> {
    let planned = plan_request(shared, request, model, &progress).await?;
    let deployment = shared.next_network.fetch_add(1, Ordering::Relaxed);
    let specs = deploy_specs(&planned, deployment);
    let hosts = hosts_of(&planned);
    if let Err(e) = ship(shared, &planned.by_host, &specs, &progress).await {
        undeploy(shared, deployment, &hosts).await;
        return Err(e);
    }
    let stages = &planned.plan.stages;
    let (input_names, output_names) = io_names(&planned.graph);
    let input_routes = input_names
        .iter()
        .map(|name| {
            let readers = stages.iter().filter(|s| s.inputs.contains(name));
            (name.clone(), hosts_of_stages(readers))
        })
        .collect();
    // Subgraphs without inputs (constants only) run on a per-request
    // trigger sent to their hosts.
    let trigger_hosts = hosts_of_stages(stages.iter().filter(|s| s.inputs.is_empty()));
    let placements: Vec<Placement> = stages
        .iter()
        .map(|s| Placement {
            host: host_of(&s.device),
            device: s.device.name.clone(),
            nodes: s.nodes,
        })
        .collect();
    let plan = plan_json(&planned, network, &hosts);
    tracing::info!(
        network,
        deployment,
        subgraphs = specs.len(),
        "network deployed"
    );
    Ok(Arc::new(Deployed {
        id: deployment,
        network,
        name: request.name.clone(),
        graph: planned.graph,
        outputs: output_names,
        input_routes,
        trigger_hosts,
        hosts,
        placements,
        plan,
    }))
}

fn host_of(d: &DeviceId) -> String {
    d.host.clone().unwrap_or_default()
}

/// The hosts of `stages`, each once, in order.
fn hosts_of_stages<'a>(stages: impl Iterator<Item = &'a Stage>) -> Vec<String> {
    let mut hosts: Vec<String> = Vec::new();
    for s in stages {
        let h = host_of(&s.device);
        if !hosts.contains(&h) {
            hosts.push(h);
        }
    }
    hosts
}

/// Each subgraph's deployment: its host, its spec (with routes: each output
/// to the workers whose subgraphs read it, and to the coordinator when it
/// is a graph output) and its model's bytes.
fn deploy_specs(planned: &Planned, deployment: u64) -> Vec<(String, DeploySpec, Bytes)> {
    let stages = &planned.plan.stages;
    let (_, output_names) = io_names(&planned.graph);
    let addr_of = |host: &str| {
        planned
            .by_host
            .get(host)
            .map(|(w, _)| w.data_addr.clone())
            .unwrap_or_default()
    };
    let route = |t: &String| {
        let mut to: Vec<Destination> = Vec::new();
        for reader in stages.iter().filter(|s| s.inputs.contains(t)) {
            let host = host_of(&reader.device);
            let addr = addr_of(&host);
            let dest = Destination::Worker { name: host, addr };
            if !to.contains(&dest) {
                to.push(dest);
            }
        }
        if output_names.contains(t) {
            to.push(Destination::Coordinator);
        }
        Route {
            tensor: t.clone(),
            to,
        }
    };
    stages
        .iter()
        .enumerate()
        .map(|(i, stage)| {
            let bytes = Bytes::from(encode_model(&stage.model));
            let spec = DeploySpec {
                network: deployment,
                subgraph: i as u32,
                device: stage.device.name.clone(),
                model_hash: hex(&Sha256::digest(&bytes)),
                inputs: stage.inputs.clone(),
                outputs: stage.outputs.iter().map(route).collect(),
            };
            (host_of(&stage.device), spec, bytes)
        })
        .collect()
}

/// Deploys every subgraph at once, reporting each as it is deployed.
async fn ship(
    shared: &Arc<Shared>,
    by_host: &ByHost,
    specs: &[(String, DeploySpec, Bytes)],
    progress: &mpsc::Sender<Control>,
) -> Result<(), CoordinatorError> {
    let total = specs.len() as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let limits = *shared.node.limits();
    let deploys = specs.iter().map(|(host, spec, bytes)| {
        let done = &done;
        async move {
            let worker = by_host
                .get(host)
                .map(|(w, _)| w.clone())
                .ok_or_else(|| CoordinatorError::Worker(format!("worker {host} is gone")))?;
            let msg = Control::Deploy(spec.clone());
            match worker
                .ask(&limits, &msg, Some(bytes), Some(progress))
                .await?
            {
                Control::Deployed { .. } => {
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    let step = Control::Progress {
                        what: "deployed subgraphs".into(),
                        done: n,
                        total,
                    };
                    let _ = progress.send(step).await;
                    Ok(())
                }
                other => Err(CoordinatorError::Worker(format!(
                    "worker {host} answered Deploy with {}",
                    other.name()
                ))),
            }
        }
    });
    futures_join(deploys).await.map(|_| ())
}

/// Stops a deployment's subgraphs on its workers that are still connected.
pub async fn undeploy(shared: &Arc<Shared>, network: u64, hosts: &[String]) {
    for host in hosts {
        let Some(worker) = shared.workers.get(host).map(|w| w.clone()) else {
            continue;
        };
        let msg = Control::Undeploy { network };
        if let Err(e) = worker.ask(shared.node.limits(), &msg, None, None).await {
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
