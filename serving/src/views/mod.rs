//! The JSON documents behind the cluster page, each useful on its own:
//! the cluster ([`cluster`]), the models and how each is cut ([`models`]),
//! and the live figures ([`crate::live`]). A front door serves them under
//! `/api/` (with the same tokens as everything else); `tessera cluster
//! --json` and `tessera models --json` print the same documents.

pub mod cluster;
pub mod models;

use std::time::Instant;

use serde::Serialize;
use tessera_client::Client;
use tessera_common::wire::control::{ModelState, ModelStatus};

pub use cluster::{ClusterDoc, Roster};
pub use models::{ModelDoc, ModelsDoc, PlanDoc, SubgraphNodesDoc};

use crate::live::{ClusterLoad, ModelLive};
use crate::{Door, ServeError};

/// How long a document waits for one model's table or plan.
const ASK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The live document: every model's figures now and over the last five
/// minutes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveDoc {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub models: Vec<ModelLive>,
}

/// The cluster document, as a client asks the coordinator for it.
pub async fn cluster_doc(client: &Client) -> Result<ClusterDoc, tessera_client::ClientError> {
    Ok(ClusterDoc::of(&client.cluster().await?))
}

/// The models document, as a client asks the coordinator for it (each
/// deployed model's routing table followed until its first version).
pub async fn models_doc(client: &Client) -> Result<ModelsDoc, tessera_client::ClientError> {
    let mut models = Vec::new();
    for status in client.models().await? {
        let (table, plan) = match status.network {
            0 => (None, None),
            network => {
                let table = client
                    .serving(&status.name)
                    .await
                    .ok()
                    .and_then(|n| n.routes());
                (table, client.loaded_plan(network).await.ok())
            }
        };
        models.push(ModelDoc::of(&status, table.as_deref(), plan.as_ref()));
    }
    Ok(ModelsDoc { models })
}

impl Door {
    /// The cluster document, lost workers included.
    pub async fn cluster_doc(&self) -> Result<ClusterDoc, ServeError> {
        let doc = cluster_doc(&self.client).await?;
        let mut roster = self.roster.lock().map_err(|_| poisoned())?;
        Ok(roster.update(doc, Instant::now()))
    }

    /// The models document, from the tables this front door follows.
    pub async fn models_doc(&self) -> Result<ModelsDoc, ServeError> {
        let mut models = Vec::new();
        for status in self.index().await? {
            let (table, plan) = match status.network {
                0 => (None, None),
                network => {
                    // A model being deployed may have no table yet: the
                    // document says what is known.
                    let table = tokio::time::timeout(ASK_WAIT, self.table(&status.name));
                    let plan = tokio::time::timeout(ASK_WAIT, self.client.loaded_plan(network));
                    let (table, plan) = tokio::join!(table, plan);
                    (
                        table.ok().and_then(Result::ok),
                        plan.ok().and_then(Result::ok),
                    )
                }
            };
            models.push(ModelDoc::of(&status, table.as_deref(), plan.as_ref()));
        }
        Ok(ModelsDoc { models })
    }

    /// Subgraph `id` of model `name`: its nodes, op types and why.
    pub async fn subgraph_doc(
        &self,
        name: &str,
        id: usize,
    ) -> Result<SubgraphNodesDoc, ServeError> {
        let network = self.network(name).await?;
        let plan = self.client.loaded_plan(network.id()).await?;
        SubgraphNodesDoc::of(name, &plan, id)
            .ok_or_else(|| ServeError::NotFound(format!("model {name} has no subgraph {id}")))
    }

    /// The live document now.
    pub fn live_doc(&self) -> LiveDoc {
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let models = match self.live.lock() {
            Ok(mut live) => live.snapshot(Instant::now()),
            Err(_) => Vec::new(),
        };
        LiveDoc { at_ms, models }
    }

    /// Samples every ready model of `models` (the coordinator's list, as
    /// just seen) from its routing table (the workers' heartbeats) into
    /// the live figures.
    pub(crate) async fn sample_live(&self, models: &[ModelStatus]) {
        let keep: Vec<String> = models
            .iter()
            .filter(|m| m.state != ModelState::Unloaded)
            .map(|m| m.name.clone())
            .collect();
        for m in models.iter().filter(|m| m.state == ModelState::Ready) {
            let Ok(table) = self.table(&m.name).await else {
                continue;
            };
            let load = table
                .copies
                .iter()
                .fold(ClusterLoad::default(), |mut l, c| {
                    l.requests_per_s += c.load.rate;
                    l.queued += c.load.queued;
                    l.sequences += c.load.sequences;
                    l.waiting += c.load.waiting;
                    l
                });
            if let Ok(mut live) = self.live.lock() {
                live.sampled(&m.name, load, Instant::now());
            }
        }
        if let Ok(mut live) = self.live.lock() {
            live.retain(&keep);
        }
    }

    /// A request on `model` answered after `latency`.
    pub(crate) fn live_served(&self, model: &str, latency: std::time::Duration) {
        if let Ok(mut live) = self.live.lock() {
            live.served(model, latency, Instant::now());
        }
    }

    pub(crate) fn live_failed(&self, model: &str) {
        if let Ok(mut live) = self.live.lock() {
            live.failed(model, Instant::now());
        }
    }

    pub(crate) fn live_tokens(&self, model: &str, n: usize) {
        if let Ok(mut live) = self.live.lock() {
            live.generated(model, n, Instant::now());
        }
    }
}

fn poisoned() -> ServeError {
    ServeError::Unavailable("the front door's state is poisoned".into())
}
