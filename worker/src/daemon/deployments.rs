//! The subgraphs deployed here: which actors read each tensor, where each
//! output goes, which outputs are sequence state (kept here, never sent
//! back to the requester), and the model hash each subgraph was deployed
//! from (what a coordinator adopts).

use std::collections::BTreeSet;
use std::sync::Arc;

use actix::Addr;
use dashmap::DashMap;
use tessera_common::wire::control::{Destination, HeldSubgraph};

use super::actor::SubgraphActor;

#[derive(Default)]
pub struct Deployments {
    /// Local consumers: (network, tensor) → actors.
    consumers: DashMap<(u64, Arc<str>), Vec<Addr<SubgraphActor>>>,
    /// Destinations of each subgraph output: (network, tensor) → where.
    routes: DashMap<(u64, Arc<str>), Vec<Destination>>,
    /// State outputs made here: (network, tensor).
    state_outputs: DashMap<(u64, Arc<str>), ()>,
    /// (deployment, subgraph) → the sha-256 of its model.
    held: DashMap<(u64, u32), String>,
}

impl Deployments {
    /// Records that subgraph `subgraph` of deployment `network` (its model
    /// `model_hash`) is served here.
    pub fn hold(&self, network: u64, subgraph: u32, model_hash: &str) {
        self.held
            .insert((network, subgraph), model_hash.to_string());
    }

    /// Every subgraph served here, sorted.
    pub fn holds(&self) -> Vec<HeldSubgraph> {
        let mut all: Vec<HeldSubgraph> = self
            .held
            .iter()
            .map(|e| HeldSubgraph {
                deployment: e.key().0,
                subgraph: e.key().1,
                model_hash: e.value().clone(),
            })
            .collect();
        all.sort_by_key(|h| (h.deployment, h.subgraph));
        all
    }

    /// The deployments served here, each once.
    pub fn networks(&self) -> BTreeSet<u64> {
        let mut all: BTreeSet<u64> = self.held.iter().map(|e| e.key().0).collect();
        all.extend(self.consumers.iter().map(|e| e.key().0));
        all
    }

    /// Registers a deployed subgraph: its actor reads `inputs`, its outputs
    /// go to `routes`. A subgraph of constants only, or that reads only
    /// state (`state_only`), also runs on a request's trigger (a later step
    /// brings none of its inputs).
    pub fn add(
        &self,
        network: u64,
        actor: &Addr<SubgraphActor>,
        inputs: &[Arc<str>],
        state_only: bool,
        routes: Vec<(Arc<str>, Vec<Destination>)>,
    ) {
        if inputs.is_empty() || state_only {
            self.consumers
                .entry((network, tessera_common::wire::tensor::TRIGGER.into()))
                .or_default()
                .push(actor.clone());
        }
        for name in inputs {
            self.consumers
                .entry((network, name.clone()))
                .or_default()
                .push(actor.clone());
        }
        for (tensor, to) in routes {
            self.routes.insert((network, tensor), to);
        }
    }

    /// Marks `tensor` of `network` as a state output made here.
    pub fn mark_state_output(&self, network: u64, tensor: Arc<str>) {
        self.state_outputs.insert((network, tensor), ());
    }

    /// Whether `tensor` of `network` is a state output made here.
    pub fn is_state_output(&self, network: u64, tensor: &Arc<str>) -> bool {
        self.state_outputs.contains_key(&(network, tensor.clone()))
    }

    /// The actors here that read `tensor` of `network`.
    pub fn readers(&self, network: u64, tensor: &Arc<str>) -> Option<Vec<Addr<SubgraphActor>>> {
        self.consumers
            .get(&(network, tensor.clone()))
            .map(|a| a.clone())
    }

    /// Where `tensor` of `network` goes when made here.
    pub fn destinations(&self, network: u64, tensor: &Arc<str>) -> Option<Vec<Destination>> {
        self.routes
            .get(&(network, tensor.clone()))
            .map(|d| d.clone())
    }

    /// The actors of `network` here, each once (every network's: `None`).
    pub fn actors(&self, network: Option<u64>) -> Vec<Addr<SubgraphActor>> {
        let mut actors: Vec<Addr<SubgraphActor>> = Vec::new();
        let of = |n: u64| network.is_none_or(|m| m == n);
        for entry in self.consumers.iter().filter(|e| of(e.key().0)) {
            for actor in entry.value() {
                if !actors.contains(actor) {
                    actors.push(actor.clone());
                }
            }
        }
        actors
    }

    /// Forgets `network`; returns its actors (to stop them).
    pub fn remove(&self, network: u64) -> Vec<Addr<SubgraphActor>> {
        let actors = self.actors(Some(network));
        self.consumers.retain(|(n, _), _| *n != network);
        self.routes.retain(|(n, _), _| *n != network);
        self.state_outputs.retain(|(n, _), _| *n != network);
        self.held.retain(|(n, _), _| *n != network);
        actors
    }
}
