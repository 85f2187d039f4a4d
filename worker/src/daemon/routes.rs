//! Where tensors go. Incoming tensors (from a requester or another worker)
//! are dispatched to the local subgraph actors that read them; outputs are
//! streamed to their consumers: local actors directly, other workers over
//! worker-to-worker links ([`super::peers`], dialled on first use), graph
//! outputs back to the request's requester ([`super::requesters`]). What
//! the subgraphs do is counted for the heartbeats ([`super::telemetry`]),
//! never reported per request to the coordinator.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;

use tessera_common::tensor::Tensor;
use tessera_common::wire::control::{Destination, ErrorKind, NodeTime, Transfer};
use tessera_common::wire::generate::Steps;
use tessera_net::Node;

use super::actor::{Admit, Arrived, Forget, SubgraphActor};
use super::deployments::Deployments;
use super::peers::Peers;
use super::requesters::Requests;
use super::sequence_stores::SequenceStores;
use super::telemetry::Telemetry;

/// Which run of which subgraph produced outputs.
#[derive(Debug, Clone)]
pub struct Ran {
    pub network: u64,
    pub subgraph: u32,
    pub request: u64,
    /// The sequence steps the request is (its tensors carry them on).
    pub sequence: Option<Steps>,
}

/// The worker's daemon in rooms: what is deployed here
/// ([`Deployments`]), what it did ([`Telemetry`]), each network's sequence
/// state (`SequenceStores`), the links to other workers ([`Peers`]) and
/// the requests requesters opened here ([`Requests`]). The router itself
/// moves tensors between them: it dispatches arrivals to the actors that
/// read them, delivers outputs, and fails requests.
pub struct Router {
    /// This worker's name.
    pub name: String,
    /// The requests requesters opened here, and where their replies go.
    pub requests: Requests,
    pub deployments: Deployments,
    pub telemetry: Telemetry,
    pub sequences: SequenceStores,
    pub peers: Peers,
}

impl Router {
    pub fn new(name: &str, node: Arc<Node>) -> Router {
        Router {
            name: name.into(),
            requests: Requests::new(name, *node.limits()),
            deployments: Deployments::default(),
            telemetry: Telemetry::default(),
            sequences: SequenceStores::default(),
            peers: Peers::new(node),
        }
    }

    /// Forgets a network; returns its actors (to stop them).
    pub fn remove(&self, network: u64) -> Vec<Addr<SubgraphActor>> {
        let actors = self.deployments.remove(network);
        self.telemetry.forget_network(network);
        self.sequences.remove(network);
        self.requests.drop_deployment(network);
        self.peers.forget_network(network);
        actors
    }

    /// Hands an arrived tensor to the local actors that read it (waiting
    /// while a mailbox is full: back-pressure on the sender's stream).
    pub async fn dispatch(
        &self,
        network: u64,
        request: u64,
        sequence: Option<&Steps>,
        name: Arc<str>,
        tensor: Tensor,
    ) {
        tracing::debug!(network, request, tensor = %name, "tensor arrived");
        let actors = match self.deployments.readers(network, &name) {
            Some(a) => a,
            None => {
                tracing::warn!(network, request, tensor = %name, "no subgraph here reads this tensor");
                return;
            }
        };
        for actor in actors {
            let msg = Arrived {
                request,
                sequence: sequence.cloned(),
                name: name.clone(),
                tensor: tensor.clone(),
            };
            if actor.send(msg).await.is_err() {
                tracing::warn!(network, request, "a subgraph actor has stopped");
            }
        }
    }

    /// Frees a sequence's state of `network` here; a fresh sequence
    /// waiting for room may then start.
    pub fn end_sequence(&self, network: u64, sequence: u64) {
        self.requests.ended(network, sequence);
        if self.sequences.end(network, sequence) {
            tracing::debug!(network, sequence, "sequence ended");
            for actor in self.deployments.actors(Some(network)) {
                actor.do_send(Admit);
            }
        }
    }

    /// Drops a request's partial inputs everywhere on this worker, and
    /// its replies.
    pub fn forget(&self, request: u64) {
        self.requests.forget(request);
        self.forget_inputs(request);
    }

    /// Drops a request's partial inputs everywhere on this worker.
    fn forget_inputs(&self, request: u64) {
        for actor in self.deployments.actors(None) {
            actor.do_send(Forget { request });
        }
    }

    /// Streams a subgraph's outputs of a request to their consumers, then
    /// tells the requester the subgraph ran.
    #[tracing::instrument(
        level = "debug",
        skip_all,
        fields(
            worker = %self.name,
            network = ran.network,
            subgraph = ran.subgraph,
            request = ran.request,
            sequence = ran.sequence.as_ref().and_then(Steps::first_id),
        )
    )]
    pub async fn deliver(
        &self,
        ran: Ran,
        outputs: Vec<(Arc<str>, Tensor)>,
        elapsed: Duration,
        nodes: Vec<NodeTime>,
    ) {
        let Ran {
            network,
            subgraph,
            request,
            sequence,
        } = ran;
        for (name, tensor) in outputs {
            let Some(to) = self.deployments.destinations(network, &name) else {
                continue;
            };
            let kept = sequence.is_some() && self.deployments.is_state_output(network, &name);
            for dest in to {
                if kept && dest == Destination::Requester {
                    continue;
                }
                let sent = match &dest {
                    Destination::Worker { name: w, .. } if *w == self.name => {
                        let (n, t) = (name.clone(), tensor.clone());
                        self.dispatch(network, request, sequence.as_ref(), n, t)
                            .await;
                        Ok(())
                    }
                    Destination::Worker { name: w, addr } => match self.peers.link(w, addr).await {
                        Ok(link) => link
                            .send_step_tensor(network, request, sequence.as_ref(), &name, &tensor)
                            .await
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    },
                    Destination::Requester => {
                        let (n, t) = (name.clone(), tensor.clone());
                        self.requests.output(request, n, t, sequence.as_ref());
                        Ok(())
                    }
                };
                tracing::debug!(tensor = %name, to = ?dest, bytes = tensor.bytes().len(), "sent");
                if let Err(e) = sent {
                    let error = format!("sending '{name}' from {}: {e}", self.name);
                    self.unreachable(request, error);
                    return;
                }
            }
        }
        self.requests
            .ran(request, subgraph, elapsed, nodes, sequence.is_some());
    }

    /// A tensor of `request` arrived here from `from` in `took`: counted
    /// for the link, and reported to the requester when it asked for
    /// counters.
    pub fn moved(&self, request: u64, tensor: &str, from: &str, bytes: u64, took: Duration) {
        self.telemetry.received(from, bytes, took);
        if request != 0 {
            self.requests.moved(Transfer {
                request,
                tensor: tensor.into(),
                from: from.into(),
                to: self.name.clone(),
                bytes,
                micros: took.as_micros() as u64,
            });
        }
    }

    /// A request failed running here.
    pub fn fail(&self, request: u64, error: String) {
        self.fail_as(request, ErrorKind::Worker, error);
    }

    /// A request failed here as `kind`: dropped here, its requester told.
    pub fn fail_as(&self, request: u64, kind: ErrorKind, error: String) {
        tracing::warn!(request, "{error}");
        self.forget_inputs(request);
        self.requests.fail(request, kind, error);
    }

    /// A tensor of `request` could not reach its consumer (the requester
    /// retries it if that peer turns out to be lost).
    pub fn unreachable(&self, request: u64, error: String) {
        tracing::warn!(request, "{error}");
        self.forget_inputs(request);
        self.requests.unreachable(request, error);
    }

    /// Forgets every network (the worker stops, or no coordinator adopted
    /// them in time); returns their actors.
    pub fn remove_all(&self) -> Vec<Addr<SubgraphActor>> {
        let networks = self.deployments.networks();
        networks.into_iter().flat_map(|n| self.remove(n)).collect()
    }
}
