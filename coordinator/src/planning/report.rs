//! The plan document clients get: a copy's partition with its hosts and
//! predictions, and a dry run that plans without deploying.

use std::sync::Arc;

use bytes::Bytes;
use tessera_common::dump::{plan_report, PlanReport, ReplicaReport};
use tessera_common::plan::Plan;
use tessera_common::schedule::predict::stage_costs;
use tessera_common::wire::control::LoadRequest;
use tessera_common::wire::Progress;
use tokio::sync::mpsc;

use super::copies::{plan_request, Planned};
use super::prepare::Scope;
use crate::{CoordinatorError, Shared};

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
