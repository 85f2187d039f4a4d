//! Where tensors go. Incoming tensors (from a requester or another worker)
//! are dispatched to the local subgraph actors that read them; outputs are
//! streamed to their consumers: local actors directly, other workers over
//! worker-to-worker links (dialled on first use), graph outputs back to the
//! request's requester ([`super::requesters`]). What the subgraphs do is
//! counted for the heartbeats (their load, the links' speed), never
//! reported per request to the coordinator.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use dashmap::DashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use tessera_common::tensor::Tensor;
use tessera_common::wire::control::{
    CompileCounts, Destination, ErrorKind, HeldSubgraph, LinkRate, NodeTime, SequenceLoad,
    SubgraphLoad, Transfer,
};
use tessera_common::wire::generate::Steps;
use tessera_common::wire::handshake::Role;
use tessera_common::wire::Limits;
use tessera_net::{Link, Node};

use super::actor::{Admit, Arrived, Forget, SubgraphActor};
use super::requesters::Requests;
use super::sequences::SequenceStore;

/// Frames that may wait in one link's queue.
const LINK_DEPTH: usize = 64;

/// Which run of which subgraph produced outputs.
#[derive(Debug, Clone)]
pub struct Ran {
    pub network: u64,
    pub subgraph: u32,
    pub request: u64,
    /// The sequence steps the request is (its tensors carry them on).
    pub sequence: Option<Steps>,
}

/// One subgraph actor's load, as heartbeats report it.
#[derive(Debug, Default)]
pub struct SubgraphGauge {
    /// Requests it holds now.
    pub depth: AtomicU32,
    pub runs: AtomicU64,
    pub busy_us: AtomicU64,
    pub failed: AtomicU64,
}

/// Tensors received from one peer (counters).
#[derive(Debug, Default)]
struct LinkCount {
    tensors: AtomicU64,
    bytes: AtomicU64,
    micros: AtomicU64,
}

pub struct Router {
    /// This worker's name.
    pub name: String,
    node: Arc<Node>,
    limits: Limits,
    /// The requests requesters opened here, and where their replies go.
    pub requests: Requests,
    /// Local consumers: (network, tensor) → actors.
    consumers: DashMap<(u64, Arc<str>), Vec<Addr<SubgraphActor>>>,
    /// Destinations of each subgraph output: (network, tensor) → where.
    routes: DashMap<(u64, Arc<str>), Vec<Destination>>,
    /// Links to other workers, by name, with the address each was dialled
    /// at: a worker that restarted elsewhere is dialled again, not reached
    /// through a connection to its old process that nothing closed yet.
    peers: tokio::sync::Mutex<HashMap<String, (String, Link)>>,
    /// Subgraph runs under way (reported in heartbeats).
    running: std::sync::atomic::AtomicU32,
    /// Each subgraph actor's load: (network, subgraph) → its gauge
    /// (reported in heartbeats).
    gauges: DashMap<(u64, u32), Arc<SubgraphGauge>>,
    /// Tensors received from each peer.
    received: DashMap<String, Arc<LinkCount>>,
    /// Each network's kept sequence state on this worker.
    sequences: DashMap<u64, Arc<std::sync::Mutex<SequenceStore>>>,
    /// State outputs made here: (network, tensor). A step of a sequence
    /// keeps them (and hands them to local and peer readers) but never
    /// sends them back to the requester.
    state_outputs: DashMap<(u64, Arc<str>), ()>,
    /// The subgraphs deployed here: (deployment, subgraph) → the sha-256
    /// of its model (what a coordinator adopts).
    held: DashMap<(u64, u32), String>,
    /// Subgraphs compiled from a model since the worker started.
    pub compiled: AtomicU64,
    /// Subgraphs loaded from the compile cache since the worker started.
    pub cache_loads: AtomicU64,
}

impl Router {
    pub fn new(name: &str, node: Arc<Node>) -> Router {
        Router {
            name: name.into(),
            limits: *node.limits(),
            requests: Requests::new(name, *node.limits()),
            node,
            consumers: DashMap::new(),
            routes: DashMap::new(),
            peers: tokio::sync::Mutex::new(HashMap::new()),
            running: Default::default(),
            gauges: DashMap::new(),
            received: DashMap::new(),
            sequences: DashMap::new(),
            state_outputs: DashMap::new(),
            held: DashMap::new(),
            compiled: AtomicU64::new(0),
            cache_loads: AtomicU64::new(0),
        }
    }

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
    pub fn deployments(&self) -> std::collections::BTreeSet<u64> {
        let mut all: std::collections::BTreeSet<u64> =
            self.held.iter().map(|e| e.key().0).collect();
        all.extend(self.consumers.iter().map(|e| e.key().0));
        all
    }

    /// Compiles and compile-cache loads since the worker started.
    pub fn compile_counts(&self) -> CompileCounts {
        CompileCounts {
            compiled: self.compiled.load(Relaxed),
            cache_loads: self.cache_loads.load(Relaxed),
        }
    }

    /// The gauge of subgraph `subgraph` of `network`'s actor.
    pub fn gauge(&self, network: u64, subgraph: u32) -> Arc<SubgraphGauge> {
        self.gauges.entry((network, subgraph)).or_default().clone()
    }

    /// Every subgraph actor's load, for a heartbeat.
    pub fn subgraph_loads(&self) -> Vec<SubgraphLoad> {
        self.gauges
            .iter()
            .map(|e| SubgraphLoad {
                network: e.key().0,
                subgraph: e.key().1,
                depth: e.value().depth.load(Relaxed),
                runs: e.value().runs.load(Relaxed),
                busy_us: e.value().busy_us.load(Relaxed),
                failed: e.value().failed.load(Relaxed),
            })
            .collect()
    }

    /// Every stateful deployment's sequences, for a heartbeat.
    pub fn sequence_loads(&self) -> Vec<SequenceLoad> {
        self.sequences
            .iter()
            .map(|e| {
                let store = e.value().lock().unwrap_or_else(|p| p.into_inner());
                SequenceLoad {
                    network: *e.key(),
                    kept: store.len() as u32,
                    waiting: store.waiting() as u32,
                }
            })
            .collect()
    }

    /// Tensors received from each peer, for a heartbeat.
    pub fn link_rates(&self) -> Vec<LinkRate> {
        self.received
            .iter()
            .map(|e| LinkRate {
                peer: e.key().clone(),
                tensors: e.value().tensors.load(Relaxed),
                bytes: e.value().bytes.load(Relaxed),
                micros: e.value().micros.load(Relaxed),
            })
            .collect()
    }

    /// Subgraphs of `network` here (each runs once per request).
    pub fn subgraphs_of(&self, network: u64) -> u32 {
        self.gauges.iter().filter(|e| e.key().0 == network).count() as u32
    }

    /// A subgraph of `network` here whose actor holds `capacity` requests
    /// or more, if any (what it is).
    pub fn full_mailbox(&self, network: u64, capacity: usize) -> Option<String> {
        self.gauges
            .iter()
            .find(|e| e.key().0 == network && e.value().depth.load(Relaxed) as usize >= capacity)
            .map(|e| format!("subgraph {} holds {capacity} requests", e.key().1))
    }

    /// A subgraph run starts (`true`) or ends.
    pub fn running(&self, starts: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if starts {
            self.running.fetch_add(1, Relaxed);
        } else {
            self.running.fetch_sub(1, Relaxed);
        }
    }

    /// Subgraph runs under way.
    pub fn in_flight(&self) -> u32 {
        self.running.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Registers a deployed subgraph: its actor reads `inputs`, its outputs
    /// go to `routes`.
    /// A subgraph that reads only state (`state_only`) also runs on the
    /// trigger of a later step, which brings none of its inputs.
    pub fn add(
        &self,
        network: u64,
        actor: &Addr<SubgraphActor>,
        inputs: &[Arc<str>],
        state_only: bool,
        routes: Vec<(Arc<str>, Vec<Destination>)>,
    ) {
        if inputs.is_empty() || state_only {
            // Constants only: runs on the request's trigger.
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

    /// Forgets a network; returns its actors (to stop them).
    pub fn remove(&self, network: u64) -> Vec<Addr<SubgraphActor>> {
        let mut actors: Vec<Addr<SubgraphActor>> = Vec::new();
        self.consumers.retain(|(n, _), addrs| {
            if *n == network {
                for a in addrs.drain(..) {
                    if !actors.iter().any(|b| b == &a) {
                        actors.push(a);
                    }
                }
                false
            } else {
                true
            }
        });
        self.routes.retain(|(n, _), _| *n != network);
        self.gauges.retain(|(n, _), _| *n != network);
        self.sequences.remove(&network);
        self.requests.drop_deployment(network);
        // Its streams to other workers finish (a link busy now keeps them
        // idle until it goes).
        if let Ok(peers) = self.peers.try_lock() {
            for (_, link) in peers.values() {
                link.forget_network(network);
            }
        }
        self.state_outputs.retain(|(n, _), _| *n != network);
        self.held.retain(|(n, _), _| *n != network);
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
        let actors = match self.consumers.get(&(network, name.clone())) {
            Some(a) => a.clone(),
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

    /// The store of `network`'s sequence state on this worker (made on
    /// first use, keeping at most `max_sequences`).
    pub fn sequence_store(
        &self,
        network: u64,
        max_sequences: u32,
    ) -> Arc<std::sync::Mutex<SequenceStore>> {
        self.sequences
            .entry(network)
            .or_insert_with(|| Arc::new(std::sync::Mutex::new(SequenceStore::new(max_sequences))))
            .clone()
    }

    /// Marks `tensor` of `network` as a state output made here.
    pub fn mark_state_output(&self, network: u64, tensor: Arc<str>) {
        self.state_outputs.insert((network, tensor), ());
    }

    /// Frees a sequence's state of `network` here; a fresh sequence
    /// waiting for room may then start.
    pub fn end_sequence(&self, network: u64, sequence: u64) {
        self.requests.ended(network, sequence);
        let ended = self.sequences.get(&network).is_some_and(|store| {
            let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
            store.end(sequence)
        });
        if ended {
            tracing::debug!(network, sequence, "sequence ended");
            for actor in self.actors_of(network) {
                actor.do_send(Admit);
            }
        }
    }

    /// The actors of `network` here.
    fn actors_of(&self, network: u64) -> Vec<Addr<SubgraphActor>> {
        let mut actors: Vec<Addr<SubgraphActor>> = Vec::new();
        for entry in self.consumers.iter().filter(|e| e.key().0 == network) {
            for actor in entry.value() {
                if !actors.contains(actor) {
                    actors.push(actor.clone());
                }
            }
        }
        actors
    }

    /// Drops a request's partial inputs everywhere on this worker, and
    /// its replies.
    pub fn forget(&self, request: u64) {
        self.requests.forget(request);
        self.forget_inputs(request);
    }

    /// Drops a request's partial inputs everywhere on this worker.
    fn forget_inputs(&self, request: u64) {
        let mut told: Vec<Addr<SubgraphActor>> = Vec::new();
        for entry in self.consumers.iter() {
            for actor in entry.value() {
                if !told.contains(actor) {
                    actor.do_send(Forget { request });
                    told.push(actor.clone());
                }
            }
        }
    }

    /// Drops the links to other workers (their connections close).
    pub async fn close_peers(&self) {
        self.peers.lock().await.clear();
    }

    /// The link to worker `name` at `addr`, dialled on first use (and again
    /// when the worker's address changed or its link closed).
    pub async fn peer(&self, name: &str, addr: &str) -> Result<Link, PeerError> {
        let mut peers = self.peers.lock().await;
        if let Some((_, link)) = peers.get(name).filter(|(at, l)| at == addr && l.is_open()) {
            return Ok(link.clone());
        }
        let socket = tessera_net::resolve(addr)
            .await
            .map_err(|source| PeerError::Resolve {
                name: name.to_string(),
                source,
            })?;
        let peer = self
            .node
            .dial(socket)
            .await
            .map_err(|source| PeerError::Unreachable {
                name: name.to_string(),
                source,
            })?;
        // The address must be the worker the route names (its certificate
        // proved the name it answered with).
        if peer.hello.node != name || peer.hello.role != Role::Worker {
            tessera_net::CloseCode::Refused
                .close(&peer.connection, "not the worker the route names");
            return Err(PeerError::NotThatWorker {
                addr: addr.to_string(),
                role: peer.hello.role,
                node: peer.hello.node.clone(),
                name: name.to_string(),
            });
        }
        let link = Link::open(peer.connection, name, self.limits, LINK_DEPTH);
        peers.insert(name.to_string(), (addr.to_string(), link.clone()));
        Ok(link)
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
            let to = match self.routes.get(&(network, name.clone())) {
                Some(to) => to.clone(),
                None => continue,
            };
            let kept =
                sequence.is_some() && self.state_outputs.contains_key(&(network, name.clone()));
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
                    Destination::Worker { name: w, addr } => match self.peer(w, addr).await {
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
        let count = self.received.entry(from.to_string()).or_default().clone();
        count.tensors.fetch_add(1, Relaxed);
        count.bytes.fetch_add(bytes, Relaxed);
        count.micros.fetch_add(took.as_micros() as u64, Relaxed);
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
        let networks = self.deployments();
        networks.into_iter().flat_map(|n| self.remove(n)).collect()
    }
}

/// Why the link to another worker cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("worker {name}: {source}")]
    Resolve {
        name: String,
        source: tessera_net::NetError,
    },
    #[error("cannot reach worker {name}: {source}")]
    Unreachable {
        name: String,
        source: tessera_net::NetError,
    },
    /// The address answered with another identity (its certificate's).
    #[error("{addr} is the {role} '{node}', not worker {name}")]
    NotThatWorker {
        addr: String,
        role: Role,
        node: String,
        name: String,
    },
}
