//! Where tensors go. Incoming tensors (from the coordinator or another
//! worker) are dispatched to the local subgraph actors that read them;
//! outputs are streamed to their consumers: local actors directly, other
//! workers over worker-to-worker links (dialled on first use), final
//! outputs back to the coordinator.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use dashmap::DashMap;
use tessera_common::tensor::Tensor;
use tessera_common::wire::cluster::WorkerReport;
use tessera_common::wire::control::{Destination, ErrorKind, MailboxDepth, NodeTime, Transfer};
use tessera_common::wire::generate::Steps;
use tessera_common::wire::handshake::Role;
use tessera_common::wire::Failure;
use tessera_common::wire::Limits;
use tessera_net::{Lane, Link, Node};

use super::actor::{Arrived, Forget, SubgraphActor};
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

pub struct Router {
    /// This worker's name.
    pub name: String,
    node: Arc<Node>,
    limits: Limits,
    /// Tensors to the coordinator.
    coordinator: Link,
    /// Control messages to the coordinator (failures, timings).
    control: Link,
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
    /// Requests each subgraph actor holds: (network, subgraph) → depth
    /// (reported in heartbeats).
    mailboxes: DashMap<(u64, u32), Arc<std::sync::atomic::AtomicU32>>,
    /// Each network's kept sequence state on this worker.
    sequences: DashMap<u64, Arc<std::sync::Mutex<SequenceStore>>>,
    /// State outputs made here: (network, tensor). A step of a sequence
    /// keeps them (and hands them to local and peer readers) but never
    /// sends them back to the coordinator.
    state_outputs: DashMap<(u64, Arc<str>), ()>,
}

impl Router {
    pub fn new(name: &str, node: Arc<Node>, coordinator: Link, control: Link) -> Router {
        Router {
            name: name.into(),
            limits: *node.limits(),
            node,
            coordinator,
            control,
            consumers: DashMap::new(),
            routes: DashMap::new(),
            peers: tokio::sync::Mutex::new(HashMap::new()),
            running: Default::default(),
            mailboxes: DashMap::new(),
            sequences: DashMap::new(),
            state_outputs: DashMap::new(),
        }
    }

    /// The depth gauge of subgraph `subgraph` of `network`'s actor.
    pub fn mailbox_gauge(&self, network: u64, subgraph: u32) -> Arc<std::sync::atomic::AtomicU32> {
        self.mailboxes
            .entry((network, subgraph))
            .or_default()
            .clone()
    }

    /// Every subgraph actor's depth, for a heartbeat.
    pub fn mailbox_depths(&self) -> Vec<MailboxDepth> {
        self.mailboxes
            .iter()
            .map(|e| MailboxDepth {
                network: e.key().0,
                subgraph: e.key().1,
                depth: e.value().load(std::sync::atomic::Ordering::Relaxed),
            })
            .collect()
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
        self.mailboxes.retain(|(n, _), _| *n != network);
        self.sequences.remove(&network);
        self.state_outputs.retain(|(n, _), _| *n != network);
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

    /// Frees a sequence's state of `network` here.
    pub fn end_sequence(&self, network: u64, sequence: u64) {
        if let Some(store) = self.sequences.get(&network) {
            let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
            if store.end(sequence) {
                tracing::debug!(network, sequence, "sequence ended");
            }
        }
    }

    /// Drops a failed request's partial inputs everywhere on this worker.
    pub fn forget(&self, request: u64) {
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

    /// Tells the coordinator how long a subgraph ran and streams its outputs
    /// of a request to their consumers.
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
        let ran = WorkerReport::Ran {
            request,
            subgraph,
            micros: elapsed.as_micros() as u64,
            nodes,
        };
        // On the data link (the outputs' lane), ahead of the outputs it
        // ships to the coordinator.
        let lane = Lane::of(sequence.as_ref());
        if let Err(e) = self.coordinator.send_control_on(lane, &ran).await {
            tracing::warn!("cannot report to the coordinator: {e}");
        }
        for (name, tensor) in outputs {
            let to = match self.routes.get(&(network, name.clone())) {
                Some(to) => to.clone(),
                None => continue,
            };
            let kept =
                sequence.is_some() && self.state_outputs.contains_key(&(network, name.clone()));
            for dest in to {
                if kept && dest == Destination::Coordinator {
                    continue;
                }
                let sent = match &dest {
                    Destination::Worker { name: w, .. } if *w == self.name => {
                        self.dispatch(
                            network,
                            request,
                            sequence.as_ref(),
                            name.clone(),
                            tensor.clone(),
                        )
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
                    Destination::Coordinator => self
                        .coordinator
                        .send_step_tensor(network, request, sequence.as_ref(), &name, &tensor)
                        .await
                        .map_err(|e| e.to_string()),
                };
                tracing::debug!(tensor = %name, to = ?dest, bytes = tensor.bytes().len(), "sent");
                if let Err(e) = sent {
                    let error = format!("sending '{name}' from {}: {e}", self.name);
                    self.unreachable(request, error).await;
                    return;
                }
            }
        }
    }

    /// Reports a tensor that arrived here to the coordinator, on the lane
    /// the outputs computed from it take.
    pub async fn moved(
        &self,
        lane: Lane,
        request: u64,
        tensor: &str,
        from: &str,
        bytes: u64,
        took: Duration,
    ) {
        let msg = WorkerReport::Moved(Transfer {
            request,
            tensor: tensor.into(),
            from: from.into(),
            to: self.name.clone(),
            bytes,
            micros: took.as_micros() as u64,
        });
        if let Err(e) = self.coordinator.send_control_on(lane, &msg).await {
            tracing::debug!("cannot report a transfer: {e}");
        }
    }

    /// Reports a failed request to the coordinator.
    pub async fn fail(&self, request: u64, error: String) {
        tracing::warn!(request, "{error}");
        self.forget(request);
        let msg = WorkerReport::Failed(Failure {
            request: Some(request),
            kind: ErrorKind::Worker,
            error,
        });
        self.report(&msg).await;
    }

    /// Reports a request whose tensor could not reach its consumer (the
    /// coordinator retries it if that peer turns out to be lost).
    pub async fn unreachable(&self, request: u64, error: String) {
        tracing::warn!(request, "{error}");
        self.forget(request);
        self.report(&WorkerReport::Unreachable { request, error })
            .await;
    }

    async fn report(&self, msg: &WorkerReport) {
        if let Err(e) = self.control.send_control(msg).await {
            tracing::warn!("cannot report to the coordinator: {e}");
        }
    }

    /// Forgets every network (the coordinator is gone); returns their
    /// actors.
    pub fn remove_all(&self) -> Vec<Addr<SubgraphActor>> {
        let networks: std::collections::BTreeSet<u64> =
            self.consumers.iter().map(|e| e.key().0).collect();
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
