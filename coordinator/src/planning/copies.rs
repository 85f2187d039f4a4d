//! A load request's copies scheduled (one by default; see
//! `tessera_common::schedule`), and each copy as one plan to deploy.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use tessera_common::affinity::AnalyticCostModel;
use tessera_common::graph::Graph;
use tessera_common::plan::{Plan, ReportedType};
use tessera_common::schedule::{schedule, Cluster, Replicas, Schedule, ScheduleError};
use tessera_common::wire::control::LoadRequest;
use tessera_common::wire::Progress;
use tokio::sync::mpsc;

use super::prepare::{prepare_request, Scope};
use super::query::ByHost;
use crate::{CoordinatorError, Shared};

/// A load request's copies, each planned.
pub(crate) struct Scheduled {
    pub graph: Arc<Graph>,
    /// The tensors' types the workers reported (see [`rebuild_graph`](super::rebuild_graph)).
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
    let started = std::time::Instant::now();
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
    tracing::info!(planned_ms = started.elapsed().as_millis(), "planned");
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

/// One planned copy, as it is deployed.
pub(crate) struct Planned<'a> {
    pub graph: &'a Arc<Graph>,
    pub by_host: &'a ByHost,
    pub plan: &'a Plan,
    pub cost: &'a AnalyticCostModel,
}
