//! `tessera-coordinator`: the cluster's coordinator. Workers register with
//! it over QUIC (mutual TLS) and send heartbeats; clients ask it to load
//! networks and run requests.
//!
//! Loading a network fans QueryNetwork out to every worker concurrently,
//! assigns affinities (priority, manual or cost policy; devices named
//! `host/DEVICE`; the cost policy uses the workers' reported metrics and
//! the round-trip time the coordinator measures), partitions, exports each
//! subgraph and deploys them in parallel, with progress sent to the client.
//! A request's inputs go straight to the workers that read them; tensors
//! then stream worker to worker, and the final outputs come back here.
//!
//! A lost worker (silent for `worker_timeout_ms`, or its connection
//! closed) does not lose requests: the networks on it are re-planned onto
//! the workers that remain and the requests in flight are retried there
//! with the inputs the coordinator keeps until each completes. A worker
//! that comes back registers again and is used by new plans.
//!
//! Layout: [`config`] (TOML + environment), [`members`] (worker sessions,
//! heartbeats, loss), [`load`] (QueryNetwork fan-out, planning,
//! deployment), [`heal`] (re-planning after a loss), [`requests`]
//! (routing, retries, deadlines, results), [`clients`] (client sessions).
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
pub mod heal;
pub mod load;
pub mod members;
pub mod requests;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use dashmap::DashMap;
use tessera_common::wire::handshake::Role;
use tessera_net::{NetError, Node};

use config::CoordinatorConfig;
use heal::Loaded;
use members::WorkerEntry;
use requests::Pending;

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
    #[error("no network {0} is loaded")]
    UnknownNetwork(u64),
    #[error("bad inputs: {0}")]
    BadInput(String),
    #[error("request {request} missed its deadline of {deadline_ms} ms{waiting}")]
    Deadline {
        request: u64,
        deadline_ms: u64,
        waiting: String,
    },
    #[error(transparent)]
    Net(#[from] NetError),
}

/// State shared by every session.
pub struct Shared {
    pub config: CoordinatorConfig,
    pub node: Node,
    pub workers: DashMap<String, Arc<WorkerEntry>>,
    /// Loaded networks by the id clients use.
    pub networks: DashMap<u64, Arc<Loaded>>,
    pub pending: DashMap<u64, Pending>,
    next_network: AtomicU64,
    next_request: AtomicU64,
    closing: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Whether [`Coordinator::shutdown`] was called.
    pub fn shutting_down(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A bound coordinator.
#[derive(Clone)]
pub struct Coordinator {
    shared: Arc<Shared>,
}

impl Coordinator {
    /// Binds the configured address (port 0: any free port). Must run inside
    /// a tokio runtime.
    pub fn bind(
        config: CoordinatorConfig,
        identity: &tessera_net::certs::NodeIdentity,
    ) -> Result<Coordinator, CoordinatorError> {
        let node = Node::bind(config.listen, identity, &config.cluster, Role::Coordinator)?;
        Ok(Coordinator {
            shared: Arc::new(Shared {
                config,
                node,
                workers: DashMap::new(),
                networks: DashMap::new(),
                pending: DashMap::new(),
                next_network: AtomicU64::new(1),
                next_request: AtomicU64::new(1),
                closing: Default::default(),
            }),
        })
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

    /// Accepts workers and clients until the endpoint closes. A peer that
    /// fails TLS or the handshake is logged and refused; the others go on.
    pub async fn serve(&self) {
        tokio::spawn(members::watchdog(self.shared.clone()));
        while let Some(peer) = self.shared.node.accept(&[Role::Worker, Role::Client]).await {
            let peer = match peer {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("refused: {e}");
                    continue;
                }
            };
            let shared = self.shared.clone();
            match peer.hello.role {
                Role::Worker => {
                    tokio::spawn(members::serve_worker(shared, peer));
                }
                _ => {
                    tokio::spawn(clients::serve_client(shared, peer));
                }
            }
        }
    }

    /// Closes every connection.
    pub async fn shutdown(&self) {
        self.shared
            .closing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.shared.node.shutdown().await;
    }
}
