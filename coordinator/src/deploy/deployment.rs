//! One planned copy deployed: its stages exported and shipped, then the
//! deployment's routes (who reads each input, who makes each output,
//! triggers) and its plan document.

use std::sync::Arc;

use bytes::Bytes;
use tessera_common::affinity::DeviceId;
use tessera_common::plan::{io_names, Stage};
use tessera_common::schedule::predict::CopyCost;
use tessera_common::schedule::Replicas;
use tessera_common::wire::control::LoadRequest;
use tessera_common::wire::Progress;
use tokio::sync::mpsc;

use super::export::export_stages;
use super::ship::ship;
use super::specs::{deploy_specs, Shipment};
use super::unload::undeploy;
use crate::network::{Deployed, Placement};
use crate::planning::{hosts_of, plan_report_of, plan_request, Planned, Scope};
use crate::{CoordinatorError, Shared};

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
    let planned = scheduled.copy(0);
    deploy_planned(
        shared,
        network,
        request,
        planned,
        cost,
        &progress,
        scope.source,
    )
    .await
}

/// Deploys one planned copy: ships its subgraphs, then routes its inputs.
/// `source`: where the model was read from (see [`Scope::source`]).
pub(super) async fn deploy_planned(
    shared: &Arc<Shared>,
    network: u64,
    request: &LoadRequest,
    planned: Planned<'_>,
    cost: &CopyCost,
    progress: &mpsc::Sender<Progress>,
    source: Option<&str>,
) -> Result<Arc<Deployed>, CoordinatorError> {
    let deployment = shared.next_id().await;
    let exported = export_stages(planned.graph, planned.plan).await?;
    let specs = deploy_specs(&planned, deployment, request, exported, source)?;
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

/// The worker a device is on (empty when it names none).
pub(super) fn host_of(d: &DeviceId) -> String {
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
