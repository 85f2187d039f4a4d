//! `tessera-coordinator`: the cluster's control plane. Workers register
//! with it over QUIC (mutual TLS) and send heartbeats; clients ask it to
//! load networks, and subscribe to each network's routing table. No
//! request passes through it: requesters (the SDK, front doors) send them
//! straight to the workers (`tessera-client`).
//!
//! Loading a network fans QueryNetwork out to every worker concurrently,
//! assigns affinities (priority, manual or cost policy; devices named
//! `host/DEVICE`; the cost policy uses the workers' reported metrics, the
//! round-trip time the coordinator measures and the link speeds the
//! workers' heartbeats report), partitions, exports each subgraph and
//! deploys them in parallel, with progress sent to the client; then
//! publishes the network's routing table ([`routes`]).
//!
//! A lost worker (silent for `worker_timeout_ms`, or its connection
//! closed) does not lose requests: the networks on it are re-planned onto
//! the workers that remain, their routing tables say so, and requesters
//! retry there. A worker that comes back registers again and is used by
//! new plans.
//!
//! With `state_dir` set, what it serves is kept ([`state`]): a coordinator
//! killed and started again restores its networks and named models and
//! adopts what the workers, which kept serving, still run: nothing is
//! deployed or compiled again.
//!
//! Named models ([`repository`]) are networks the coordinator keeps
//! loaded: from `[models.NAME]` tables at start, or loaded by name through
//! the SDK or a front door's model control. Front doors (KServe v2 over
//! HTTP and gRPC, OpenAI) are `tessera-serving`'s: the coordinator binary
//! runs one as a requester of its own cluster when `http_listen` or
//! `grpc_listen` is set, with the cluster's metrics ([`metrics`]).
//!
//! Layout: [`config`] (TOML + environment), [`members`] (worker sessions,
//! heartbeats, loss), [`workers`] (what is known of each worker, and
//! asking it), [`planning`] (QueryNetwork fan-out, cost model, plan),
//! [`deploy`] (shipping subgraphs, unloading), [`network`] (a loaded
//! network's state), [`routes`] (routing tables and their subscriptions),
//! [`heal`] (re-planning after a loss), [`clients`] (client sessions),
//! [`repository`] (named models), [`embedding`] (an embedding network's
//! spec), [`generative`] (a generative network's
//! spec), [`metrics`] (Prometheus), [`state`] (the kept state, restore and
//! adoption).
//!
//! # Example
//!
//! ```no_run
//! use tessera_coordinator::{config::CoordinatorConfig, Coordinator};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = CoordinatorConfig::load(Some("configs/cluster.toml".as_ref()), |k| std::env::var(k).ok())?;
//! let identity = tessera_net::certs::load_identity(&config.certs, &config.name)?;
//! let coordinator = Coordinator::bind(config, &identity)?;
//! println!("listening on {}", coordinator.local_addr()?);
//! coordinator.serve().await;
//! # Ok(()) }
//! ```

pub mod clients;
pub mod config;
pub mod deploy;
pub mod drain;
pub mod embedding;
pub mod generative;
pub mod ha;
pub mod heal;
pub mod known;
pub mod members;
pub mod metrics;
pub mod network;
pub mod planning;
pub mod repository;
pub mod routes;
pub mod state;
pub mod workers;

use std::net::SocketAddr;
use std::sync::Arc;

use dashmap::DashMap;
use tessera_common::wire::control::ErrorKind;
use tessera_common::wire::handshake::Role;
use tessera_net::{NetError, Node};

use config::CoordinatorConfig;
use network::Loaded;
use workers::WorkerEntry;

/// Errors of the coordinator's operations, as clients see them.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error("model: {0}")]
    Model(String),
    #[error("devices: {0}")]
    Devices(String),
    #[error("planning: {0}")]
    Plan(String),
    #[error("{0}")]
    Worker(String),
    /// A worker could not take the subgraph it was sent (its compile
    /// failed, say out of memory, or it was lost meanwhile).
    #[error("worker {host}: {error}")]
    Deploy { host: String, error: String },
    #[error("no network {0} is loaded")]
    UnknownNetwork(u64),
    #[error("no model named '{0}' in the repository")]
    UnknownModel(String),
    /// A named model known but not deployed now.
    #[error("{0}")]
    NotReady(String),
    #[error("bad inputs: {0}")]
    BadInput(String),
    #[error(transparent)]
    Net(#[from] NetError),
    /// The state directory cannot be opened.
    #[error("state_dir: {0}")]
    State(#[from] state::StoreError),
    /// HA cannot start (etcd cannot be reached).
    #[error("ha: {0}")]
    Ha(#[from] ha::HaError),
}

impl CoordinatorError {
    /// The kind clients see in `Failed` (and HTTP maps to a status).
    pub fn kind(&self) -> ErrorKind {
        match self {
            CoordinatorError::Model(_)
            | CoordinatorError::Devices(_)
            | CoordinatorError::BadInput(_) => ErrorKind::BadInput,
            CoordinatorError::Plan(_) => ErrorKind::Refused,
            CoordinatorError::Worker(_) | CoordinatorError::Deploy { .. } => ErrorKind::Worker,
            CoordinatorError::UnknownNetwork(_) | CoordinatorError::UnknownModel(_) => {
                ErrorKind::NotFound
            }
            CoordinatorError::NotReady(_)
            | CoordinatorError::Net(_)
            | CoordinatorError::State(_)
            | CoordinatorError::Ha(_) => ErrorKind::Unavailable,
        }
    }
}

/// State shared by every session.
pub struct Shared {
    pub config: CoordinatorConfig,
    pub node: Node,
    pub workers: DashMap<String, Arc<WorkerEntry>>,
    /// Loaded networks by the id clients use.
    pub networks: DashMap<u64, Arc<Loaded>>,
    /// Named models.
    pub repository: repository::Repository,
    pub metrics: metrics::Metrics,
    /// What is kept across restarts (`state_dir`), the epoch and the ids.
    pub state: state::Keeper,
    /// Set once by [`Coordinator::shutdown`].
    closing: tokio::sync::watch::Sender<bool>,
    /// When the coordinator started.
    pub started: std::time::Instant,
    /// HA (`[ha]`): its place in etcd's election.
    pub ha: Option<Arc<ha::Ha>>,
    /// Who leads (without HA: this one, always).
    pub leader: tokio::sync::watch::Sender<ha::LeaderView>,
    /// Why this coordinator stepped down (HA), once it did.
    pub stepped_down: tokio::sync::watch::Sender<Option<String>>,
    /// When its lead began (its start without HA).
    pub led_since: std::sync::OnceLock<std::time::Instant>,
    /// What a standby prepared for a takeover (HA).
    pub warm: state::restore::Warm,
    /// The last placement of each model loaded as one copy (by
    /// `deploy::load::placement_key`): a later load of it keeps that cut
    /// while it still fits and predicts nearly as well, so the workers' caches
    /// hold its subgraphs.
    pub placements: DashMap<String, std::collections::BTreeMap<String, String>>,
}

impl Shared {
    /// Whether [`Coordinator::shutdown`] was called.
    pub fn shutting_down(&self) -> bool {
        *self.closing.borrow()
    }

    /// A fresh id for a network or a deployment.
    pub async fn next_id(&self) -> u64 {
        self.state.next_id().await
    }

    /// Whether this coordinator leads now: always without HA; with it,
    /// once elected and while its lease is surely alive.
    pub fn leads(&self) -> bool {
        match &self.ha {
            None => true,
            Some(ha) => self.leader.borrow().leading && ha.lease_alive(std::time::Instant::now()),
        }
    }

    /// The address workers and clients dial for this coordinator.
    pub fn advertised(&self) -> String {
        match &self.ha {
            Some(ha) => ha.advertise.clone(),
            None => self
                .config
                .ha
                .advertised(self.node.local_addr().unwrap_or(self.config.listen)),
        }
    }

    /// Waits until [`Coordinator::shutdown`] is called.
    pub async fn closed(&self) {
        let mut closing = self.closing.subscribe();
        // An error: the sender is gone, so is the coordinator.
        let _ = closing.wait_for(|c| *c).await;
    }
}

/// A bound coordinator.
#[derive(Clone)]
pub struct Coordinator {
    shared: Arc<Shared>,
}

impl Coordinator {
    /// Binds the configured address (port 0: any free port) and opens the
    /// state directory, if one is set (a second coordinator on the same
    /// one is refused). Must run inside a tokio runtime. With `[ha]`, use
    /// [`Coordinator::open`].
    pub fn bind(
        config: CoordinatorConfig,
        identity: &tessera_net::certs::NodeIdentity,
    ) -> Result<Coordinator, CoordinatorError> {
        if config.ha.enabled() {
            return Err(CoordinatorError::Ha(ha::HaError::NeedsOpen));
        }
        let state = state::Keeper::open(&config.state_dir)?;
        Coordinator::with(config, identity, state, None)
    }

    /// [`Coordinator::bind`], or with `[ha]` also reaches etcd (an error
    /// if it cannot) and stands by until [`Coordinator::serve`] campaigns.
    pub async fn open(
        config: CoordinatorConfig,
        identity: &tessera_net::certs::NodeIdentity,
    ) -> Result<Coordinator, CoordinatorError> {
        if !config.ha.enabled() {
            return Coordinator::bind(config, identity);
        }
        let advertise = config.ha.advertised(config.listen);
        let ha = ha::Ha::connect(&config.ha, advertise).await?;
        let state = state::Keeper::etcd(ha.client(), &config.ha.prefix, &config.state_dir)?;
        Coordinator::with(config, identity, state, Some(Arc::new(ha)))
    }

    fn with(
        config: CoordinatorConfig,
        identity: &tessera_net::certs::NodeIdentity,
        state: state::Keeper,
        ha: Option<Arc<ha::Ha>>,
    ) -> Result<Coordinator, CoordinatorError> {
        let node = Node::bind(config.listen, identity, &config.cluster, Role::Coordinator)?;
        let leading = ha.is_none();
        let leader = ha::LeaderView {
            leading,
            leader: None,
            epoch: if leading { state.epoch() } else { 0 },
        };
        let shared = Arc::new(Shared {
            repository: repository::Repository::from_config(&config.models),
            metrics: metrics::Metrics::new(),
            config,
            node,
            workers: DashMap::new(),
            networks: DashMap::new(),
            state,
            closing: tokio::sync::watch::Sender::new(false),
            started: std::time::Instant::now(),
            ha,
            leader: tokio::sync::watch::Sender::new(leader),
            stepped_down: tokio::sync::watch::Sender::new(None),
            led_since: std::sync::OnceLock::new(),
            warm: Default::default(),
            placements: DashMap::new(),
        });
        if leading {
            let addr = shared.advertised();
            shared.leader.send_modify(|v| v.leader = Some(addr));
        }
        Ok(Coordinator { shared })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, CoordinatorError> {
        Ok(self.shared.node.local_addr()?)
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Names of the registered workers.
    pub fn workers(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .shared
            .workers
            .iter()
            .map(|w| w.key().clone())
            .collect();
        names.sort();
        names
    }

    /// Leads (restores the kept state, if any) or, with `[ha]`,
    /// campaigns for the lead; meanwhile accepts workers and clients until
    /// the endpoint closes (at a shutdown or a step-down). A peer that
    /// fails TLS or the handshake is logged and refused; the others go on.
    pub async fn serve(&self) {
        match &self.shared.ha {
            None => lead(&self.shared).await,
            Some(ha) => {
                tokio::spawn(ha::run(self.shared.clone(), ha.clone()));
            }
        }
        // Each connection handshakes on its own task: one slow or silent
        // peer holds up no other.
        while let Some(incoming) = self.shared.node.incoming().await {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                // Clients, front doors (a worker's, with its worker
                // certificate; the coordinator's own) and workers.
                let accepted = [Role::Worker, Role::Client, Role::Coordinator];
                let peer = match shared.node.handshake(incoming, &accepted).await {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::warn!("refused: {e}");
                        return;
                    }
                };
                match peer.hello.role {
                    Role::Worker => members::serve_worker_or_client(shared, peer).await,
                    _ => clients::serve_client(shared, peer).await,
                }
            });
        }
    }

    /// Why this coordinator stepped down (lost its lead or etcd), if it
    /// did: [`Coordinator::serve`] has returned.
    pub fn stepped_down(&self) -> Option<String> {
        self.shared.stepped_down.borrow().clone()
    }

    /// Closes every connection.
    pub async fn shutdown(&self) {
        self.shared.closing.send_replace(true);
        self.shared.node.shutdown().await;
    }
}

/// What the leader does when its lead begins: restores the kept state,
/// then watches the workers and keeps the named models loaded.
pub(crate) async fn lead(shared: &Arc<Shared>) {
    let _ = shared.led_since.set(std::time::Instant::now());
    state::restore::restore(shared).await;
    tokio::spawn(members::watchdog(shared.clone()));
    tokio::spawn(repository::keep_loaded(shared.clone()));
}

/// Runs futures concurrently until every one has finished; then the first
/// error in the given order, if any, is the result.
pub(crate) async fn futures_join<T, F>(
    futures: impl Iterator<Item = F>,
) -> Result<Vec<T>, CoordinatorError>
where
    F: std::future::Future<Output = Result<T, CoordinatorError>>,
{
    let all: Vec<Result<T, CoordinatorError>> = futures_util::future::join_all(futures).await;
    all.into_iter().collect()
}
