//! Deploying a planned network: every copy (replica), every subgraph of
//! each exported now (its weights slices of the model the coordinator
//! holds once) and streamed to its worker in parallel, with byte progress
//! forwarded to the client, unless the worker's compile cache holds it;
//! routes from each output to its readers; a failed deployment undeploys
//! what was deployed. Also unloading.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use tessera_common::affinity::DeviceId;
use tessera_common::graph::Graph;
use tessera_common::onnx::parts::{encode_model_parts, Part};
use tessera_common::plan::{io_names, Stage};
use tessera_common::schedule::predict::CopyCost;
use tessera_common::schedule::Replicas;
use tessera_common::wire::cluster::{ToWorker, WorkerAnswer};
use tessera_common::wire::control::{DeploySpec, Destination, LoadRequest, Route, StatePair};
use tessera_common::wire::pieces::{self, PieceRef};
use tessera_common::wire::{Limits, Message, Progress};
use tessera_net::exchange;
use tokio::sync::mpsc;

use crate::network::{Deployed, Loaded, Origin, Parts, Placement, Replica, SubgraphModel};
use crate::planning::{hosts_of, plan_report_of, plan_request, ByHost, Planned, Scope};
use crate::workers::WorkerEntry;
use crate::{futures_join, CoordinatorError, Shared};

/// Loads `model` as asked (its copies planned and deployed); returns the
/// loaded network (its id and plan).
pub async fn load_network(
    shared: &Arc<Shared>,
    request: LoadRequest,
    (model, origin): (Bytes, Origin),
    progress: mpsc::Sender<Progress>,
) -> Result<Arc<Loaded>, CoordinatorError> {
    let network = shared.next_id().await;
    let loaded = deploy_replicas(shared, network, request, model, &progress).await?;
    let loaded = Arc::new(Loaded { origin, ..loaded });
    shared.networks.insert(network, loaded.clone());
    // Kept before the client hears of it: a coordinator restarted after
    // the answer knows the network.
    shared.state.save_network(&loaded).await;
    if matches!(loaded.origin, Origin::Sent) {
        crate::ha::model_copies::to_standbys(shared, &loaded.model_sha()).await;
    }
    tracing::info!(network, copies = loaded.replicas.len(), "network loaded");
    Ok(loaded)
}

/// Plans the request's copies and deploys them; a worker that cannot take
/// its subgraph (its compile fails, say because it offered memory it does
/// not have, or it is lost) is left out and the copies planned again over
/// the others, until they deploy or cannot be planned.
#[tracing::instrument(name = "deploy", skip_all, fields(network = network, name = %request.name))]
async fn deploy_replicas(
    shared: &Arc<Shared>,
    network: u64,
    request: LoadRequest,
    model: Bytes,
    progress: &mpsc::Sender<Progress>,
) -> Result<Loaded, CoordinatorError> {
    let mut left_out: Vec<(String, String)> = Vec::new();
    loop {
        let only: Option<Vec<String>> = (!left_out.is_empty()).then(|| {
            shared
                .workers
                .iter()
                .map(|w| w.name.clone())
                .filter(|w| left_out.iter().all(|(h, _)| h != w))
                .collect()
        });
        let outcome =
            deploy_copies(shared, network, &request, &model, progress, only.as_deref()).await;
        let note = || {
            let failed: Vec<String> = left_out
                .iter()
                .map(|(h, e)| format!("{h} could not take its subgraph ({e})"))
                .collect();
            format!("planned again without them: {}", failed.join("; "))
        };
        match outcome {
            Err(CoordinatorError::Deploy { host, error })
                if left_out.iter().all(|(h, _)| *h != host) =>
            {
                tracing::warn!(
                    "worker {host} could not take its subgraph ({error}); planning again without it"
                );
                left_out.push((host, error));
            }
            Err(CoordinatorError::Plan(why)) if !left_out.is_empty() => {
                return Err(CoordinatorError::Plan(format!("{why}; {}", note())))
            }
            Err(e) if !left_out.is_empty() => {
                return Err(CoordinatorError::Worker(format!("{e}; {}", note())))
            }
            other => return other,
        }
    }
}

/// Plans the request's copies (over `only`'s workers, if given) and
/// deploys every one at once; when one fails, the others are undeployed.
async fn deploy_copies(
    shared: &Arc<Shared>,
    network: u64,
    request: &LoadRequest,
    model: &Bytes,
    progress: &mpsc::Sender<Progress>,
    only: Option<&[String]>,
) -> Result<Loaded, CoordinatorError> {
    let key = placement_key(request, model);
    let one_copy = request.replicas == Replicas::Count(1);
    let previous = match shared.placements.get(&key) {
        Some(p) if one_copy => p.clone(),
        _ => Default::default(),
    };
    let scope = Scope {
        only,
        network: Some(network),
        previous,
    };
    let scheduled =
        plan_request(shared, request, model, progress, request.replicas, &scope).await?;
    check_batching(request, &scheduled.graph)?;
    let generator = match &request.generation {
        Some(spec) => Some(Arc::new(crate::generative::check(spec, &scheduled.graph)?)),
        None => None,
    };
    let embedder = crate::embedding::checked(request, &scheduled.graph)?;
    let copies = &scheduled.schedule.copies;
    let deploys = copies.iter().enumerate().map(|(i, copy)| {
        deploy_planned(
            shared,
            network,
            request,
            scheduled.copy(i),
            &copy.cost,
            progress,
        )
    });
    let deployed: Vec<Result<Arc<Deployed>, CoordinatorError>> =
        futures_util::future::join_all(deploys).await;
    if let Some(at) = deployed.iter().position(Result::is_err) {
        for d in deployed.iter().flatten() {
            undeploy(shared, d.id, &d.hosts).await;
        }
        let error = deployed.into_iter().nth(at).and_then(Result::err);
        return Err(error.unwrap_or_else(|| CoordinatorError::Plan("deployment failed".into())));
    }
    let several = copies.len() > 1;
    if let (true, [Ok(only)]) = (one_copy, &deployed[..]) {
        shared.placements.insert(key, only.plan.affinity.clone());
    }
    let replicas = deployed
        .into_iter()
        .flatten()
        .zip(copies)
        .enumerate()
        .map(|(i, (d, copy))| Arc::new(Replica::new(i + 1, several.then(|| copy.hosts.clone()), d)))
        .collect();
    Ok(Loaded::new(Parts {
        id: network,
        request: request.clone(),
        model: model.clone(),
        origin: Origin::Sent,
        graph: scheduled.graph,
        types: scheduled.types,
        replicas,
        considered: scheduled.schedule.considered,
        generator,
        embedder,
    }))
}

/// What a load's remembered placement is found by: its name, size and
/// devices. A placement is only a hint (the planner keeps it only where
/// it names the model's nodes, still fits and predicts within 10 % of the
/// best cut), so a model changed under the same name costs nothing.
pub(crate) fn placement_key(request: &LoadRequest, model: &Bytes) -> String {
    format!(
        "{}|{}|{}|{:?}|{:?}",
        request.name,
        model.len(),
        request.devices,
        request.policy,
        request.shapes
    )
}

/// Plans one copy of `model` as asked over the workers connected now,
/// within `scope` (its `network` is the network this deployment serves)
/// and deploys it as a new deployment of that network.
#[tracing::instrument(skip_all, fields(network = scope.network, name = %request.name))]
pub(crate) async fn deploy(
    shared: &Arc<Shared>,
    request: &LoadRequest,
    model: &Bytes,
    scope: &Scope<'_>,
    progress: mpsc::Sender<Progress>,
) -> Result<Arc<Deployed>, CoordinatorError> {
    let network = scope.network.unwrap_or_default();
    let scheduled =
        plan_request(shared, request, model, &progress, Replicas::Count(1), scope).await?;
    let cost = &scheduled.schedule.copies[0].cost;
    deploy_planned(shared, network, request, scheduled.copy(0), cost, &progress).await
}

/// Deploys one planned copy: ships its subgraphs, then routes its inputs.
async fn deploy_planned(
    shared: &Arc<Shared>,
    network: u64,
    request: &LoadRequest,
    planned: Planned<'_>,
    cost: &CopyCost,
    progress: &mpsc::Sender<Progress>,
) -> Result<Arc<Deployed>, CoordinatorError> {
    let deployment = shared.next_id().await;
    let exported = export_stages(planned.graph, planned.plan).await?;
    let specs = deploy_specs(&planned, deployment, request, exported)?;
    let models = specs.iter().map(Shipment::model).collect();
    let hosts = hosts_of(planned.plan);
    if let Err(e) = ship(shared, planned.by_host, &specs, progress).await {
        undeploy(shared, deployment, &hosts).await;
        return Err(e);
    }
    let stages = &planned.plan.stages;
    let (input_names, output_names) = io_names(planned.graph);
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
    let pasts: Vec<String> = planned
        .graph
        .state_pairs()
        .unwrap_or_default()
        .into_iter()
        .map(|p| p.past)
        .collect();
    let state_trigger_hosts = hosts_of_stages(
        stages
            .iter()
            .filter(|s| !s.inputs.is_empty() && s.inputs.iter().all(|i| pasts.contains(i))),
    );
    let placements: Vec<Placement> = stages
        .iter()
        .map(|s| Placement {
            host: host_of(&s.device),
            device: s.device.name.clone(),
            nodes: s.nodes,
        })
        .collect();
    let plan = plan_report_of(&planned, network, &hosts);
    // Which worker makes each graph output, and every host's data address:
    // the routing table's.
    let output_makers = output_names
        .iter()
        .filter_map(|name| {
            let maker = stages.iter().find(|s| s.outputs.contains(name))?;
            Some((name.clone(), host_of(&maker.device)))
        })
        .collect();
    let addrs = hosts
        .iter()
        .map(|h| {
            let addr = planned.by_host.get(h).map(|(w, _)| w.data_addr.clone());
            (h.clone(), addr.unwrap_or_default())
        })
        .collect();
    let state_outputs = planned
        .graph
        .state_pairs()
        .unwrap_or_default()
        .into_iter()
        .map(|p| p.present)
        .collect();
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
        graph: planned.graph.clone(),
        outputs: output_names,
        state_outputs,
        input_routes,
        output_makers,
        addrs,
        trigger_hosts,
        state_trigger_hosts,
        hosts,
        placements,
        plan,
        predicted_latency_us: cost.latency_us,
        predicted_rps: cost.throughput_rps(),
        models,
    }))
}

/// Dynamic batching needs a dynamic first (batch) dimension on every graph
/// input and output, and batches of at least two.
fn check_batching(request: &LoadRequest, graph: &Graph) -> Result<(), CoordinatorError> {
    let Some(batching) = request.batching else {
        return Ok(());
    };
    if batching.max_batch < 2 {
        return Err(CoordinatorError::BadInput(format!(
            "max_batch {} batches nothing: it must be at least 2",
            batching.max_batch
        )));
    }
    let static_batch = graph.inputs.iter().chain(&graph.outputs).find(|&&t| {
        let t = graph.tensor(t);
        t.shape
            .as_ref()
            .is_some_and(|s| s.first().is_none_or(|d| d.known().is_some()))
    });
    match static_batch {
        Some(&t) => {
            let t = graph.tensor(t);
            Err(CoordinatorError::BadInput(format!(
                "batching needs a dynamic first (batch) dimension, but '{}' is {}",
                t.name,
                t.type_string()
            )))
        }
        None => Ok(()),
    }
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

/// One subgraph to deploy: its host, its spec and its model, as pieces
/// (see [`encode_model_parts`]: the weights are the coordinator's own
/// bytes).
struct Shipment {
    host: String,
    spec: DeploySpec,
    model: Vec<Part>,
}

impl Shipment {
    /// What a worker must hold of it to be adopted.
    fn model(&self) -> SubgraphModel {
        SubgraphModel {
            host: self.host.clone(),
            subgraph: self.spec.subgraph,
            model_hash: self.spec.model_hash.clone(),
        }
    }
}

/// A stage's model as pieces, its layout and its content hash.
struct Exported {
    parts: Vec<Part>,
    pieces: Vec<PieceRef>,
    model_hash: String,
}

/// Every stage's model, exported and hashed off the async threads, the
/// stages side by side (hashing a language model's weights takes a
/// fraction of a second per stage).
async fn export_stages(
    graph: &Arc<Graph>,
    plan: &tessera_common::plan::Plan,
) -> Result<Vec<Exported>, CoordinatorError> {
    let (graph, plan) = (graph.clone(), plan.clone());
    tokio::task::spawn_blocking(move || {
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..plan.stages.len())
                .map(|i| {
                    let (graph, plan) = (&graph, &plan);
                    scope.spawn(move || {
                        let model = plan
                            .export_stage(graph, i)
                            .map_err(|e| CoordinatorError::Plan(e.to_string()))?;
                        let parts = encode_model_parts(&model);
                        let (pieces, model_hash) = pieces::layout(&parts);
                        Ok::<_, CoordinatorError>(Exported {
                            parts,
                            pieces,
                            model_hash,
                        })
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| {
                    t.join().unwrap_or_else(|_| {
                        Err(CoordinatorError::Plan("exporting a stage failed".into()))
                    })
                })
                .collect()
        })
    })
    .await
    .map_err(|e| CoordinatorError::Plan(format!("exporting the stages failed: {e}")))?
}

/// Each subgraph's deployment: its host, its spec (with routes: each output
/// to the workers whose subgraphs read it, and back to the request's
/// requester when it is a graph output) and its model, `exported`.
fn deploy_specs(
    planned: &Planned,
    deployment: u64,
    request: &LoadRequest,
    exported: Vec<Exported>,
) -> Result<Vec<Shipment>, CoordinatorError> {
    let batching = request.batching;
    let stages = &planned.plan.stages;
    let pairs = planned.graph.state_pairs().unwrap_or_default();
    if request.generation.is_some() {
        check_state_kept(stages, &pairs)?;
    }
    let generation = request.generation.as_ref();
    let max_sequences = generation.map_or(0, |g| g.max_sequences);
    let max_queued = generation.map_or(0, |g| g.max_queued);
    let queue_timeout_ms = generation.map_or(0, |g| g.queue_timeout_ms);
    let (_, output_names) = io_names(planned.graph);
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
            to.push(Destination::Requester);
        }
        Route {
            tensor: t.clone(),
            to,
        }
    };
    stages
        .iter()
        .zip(exported)
        .enumerate()
        .map(|(i, (stage, exported))| {
            let Exported {
                parts: model,
                pieces,
                model_hash,
            } = exported;
            let spec = DeploySpec {
                network: deployment,
                subgraph: i as u32,
                device: stage.device.name.clone(),
                model_hash,
                model_bytes: pieces::model_len(&pieces),
                pieces,
                inputs: stage.inputs.clone(),
                outputs: stage.outputs.iter().map(route).collect(),
                // A subgraph of constants only runs once per trigger.
                batching: batching.filter(|_| !stage.inputs.is_empty()),
                state: pairs
                    .iter()
                    .filter(|p| {
                        stage.inputs.contains(&p.past) || stage.outputs.contains(&p.present)
                    })
                    .cloned()
                    .collect(),
                max_sequences,
                max_queued,
                queue_timeout_ms,
            };
            Ok(Shipment {
                host: host_of(&stage.device),
                spec,
                model,
            })
        })
        .collect()
}

/// Each state pair's state must stay on one worker: the stages that read
/// its input and the one that makes its output run on the same host.
fn check_state_kept(stages: &[Stage], pairs: &[StatePair]) -> Result<(), CoordinatorError> {
    for pair in pairs {
        let mut hosts: Vec<String> = stages
            .iter()
            .filter(|s| s.inputs.contains(&pair.past) || s.outputs.contains(&pair.present))
            .map(|s| host_of(&s.device))
            .collect();
        hosts.dedup();
        if hosts.len() > 1 {
            return Err(CoordinatorError::Plan(format!(
                "the state {} → {} would be split over workers {}; a sequence's state must \
                 stay on one worker",
                pair.present,
                pair.past,
                hosts.join(", ")
            )));
        }
    }
    Ok(())
}

/// Deploys every subgraph at once, reporting each as it is deployed.
async fn ship(
    shared: &Arc<Shared>,
    by_host: &ByHost,
    specs: &[Shipment],
    progress: &mpsc::Sender<Progress>,
) -> Result<(), CoordinatorError> {
    let total = specs.len() as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let limits = *shared.node.limits();
    let deploys = specs.iter().map(|shipment| {
        let done = &done;
        let host = &shipment.host;
        async move {
            let worker = by_host.get(host).map(|(w, _)| w.clone()).ok_or_else(|| {
                CoordinatorError::Deploy {
                    host: host.clone(),
                    error: "it is gone".into(),
                }
            })?;
            match deploy_one(&worker, &limits, shipment, progress).await? {
                WorkerAnswer::Deployed { .. } => {
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    let step = Progress {
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

/// Progress is reported at most every this many bytes of a model.
const PROGRESS_EVERY: u64 = 8 << 20;

/// One subgraph's Deploy exchange: the spec; the model, streamed from the
/// pieces with byte progress, only if the worker asks for it (its compile
/// cache lacks it), less the weights it holds; then the worker's answer.
async fn deploy_one(
    worker: &WorkerEntry,
    limits: &Limits,
    shipment: &Shipment,
    progress: &mpsc::Sender<Progress>,
) -> Result<WorkerAnswer, CoordinatorError> {
    let failed = |error: String| CoordinatorError::Deploy {
        host: worker.name.clone(),
        error,
    };
    let name = &worker.name;
    let (mut send, mut recv) = exchange::open(&worker.connection)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let msg = ToWorker::Deploy {
        spec: shipment.spec.clone(),
        epoch: worker.epoch,
    };
    exchange::send_message(&mut send, &msg, None, limits)
        .await
        .map_err(|e| failed(e.to_string()))?;
    loop {
        let answer = exchange::answer::<WorkerAnswer>(&mut recv, limits, |p| {
            let _ = progress.try_send(p);
        })
        .await
        .map_err(|e| failed(e.to_string()))?;
        let WorkerAnswer::NeedModel { missing } = answer else {
            let _ = send.finish();
            return Ok(answer);
        };
        let spec = &shipment.spec;
        pieces::check_missing(&spec.pieces, &missing)
            .map_err(|e| failed(format!("its ask for the model: {e}")))?;
        let total = pieces::payload_len(&spec.pieces, &missing);
        tracing::info!(
            subgraph = spec.subgraph,
            host = %name,
            sending = total,
            of = spec.model_bytes,
            weights_held = spec.pieces.iter().filter(|p| matches!(p, PieceRef::Weight { .. })).count() - missing.len(),
            "sending the subgraph's model"
        );
        let what = format!("sending subgraph {} to {name}", spec.subgraph);
        let mut reported = 0;
        let report = |done: u64| {
            if done == total || done >= reported + PROGRESS_EVERY {
                reported = done;
                let step = Progress {
                    what: what.clone(),
                    done,
                    total,
                };
                let _ = progress.try_send(step);
            }
        };
        let sent = exchange::send_message_parts(
            &mut send,
            &ToWorker::Model,
            &pieces::payload(&shipment.model, &missing),
            limits,
            report,
        )
        .await;
        if let Err(e) = sent {
            // The worker stopped reading: its answer says why, if it gave one.
            let why = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                exchange::answer::<WorkerAnswer>(&mut recv, limits, |_| {}),
            )
            .await;
            return Err(failed(match why {
                Ok(Err(reason @ exchange::ExchangeError::Failed { .. })) => reason.to_string(),
                _ => format!("sending the model: {e}"),
            }));
        }
        let _ = send.finish();
    }
}

/// Stops a deployment's subgraphs on its workers that are still connected.
pub async fn undeploy(shared: &Arc<Shared>, network: u64, hosts: &[String]) {
    for host in hosts {
        let Some(worker) = shared.workers.get(host).map(|w| w.clone()) else {
            continue;
        };
        let msg = ToWorker::Undeploy {
            network,
            epoch: worker.epoch,
        };
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
    shared.state.remove_network(network).await;
    crate::state::save_models(shared).await;
    for deployed in loaded.deployments() {
        undeploy(shared, deployed.id, &deployed.hosts).await;
    }
    Ok(())
}
