//! A loaded network and its deployments: what serves it now (ready,
//! healing, broken), waiting for a deployment, and where each subgraph of
//! a deployment runs. The state the request path, the healing path and the
//! repository share; the code that changes it lives in [`crate::deploy`]
//! and [`crate::heal`].

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tessera_common::graph::Graph;
use tessera_common::wire::control::LoadRequest;
use tokio::sync::watch;

/// Where one subgraph runs.
#[derive(Debug, Clone)]
pub struct Placement {
    pub host: String,
    pub device: String,
    pub nodes: usize,
}

/// One deployment of a loaded network (a network lost a worker gets a new
/// one, see [`crate::heal`]).
pub struct Deployed {
    /// The deployment's id: the network id on the wire to workers.
    pub id: u64,
    /// The network's id, as clients know it.
    pub network: u64,
    pub name: String,
    pub graph: Graph,
    pub outputs: Vec<String>,
    /// Graph input → workers that read it.
    pub input_routes: Vec<(String, Vec<String>)>,
    /// Workers with subgraphs that have no inputs (sent a trigger per
    /// request).
    pub trigger_hosts: Vec<String>,
    /// Every worker it runs on.
    pub hosts: Vec<String>,
    pub placements: Vec<Placement>,
    /// The plan as JSON (subgraphs, affinity, explanations, hosts).
    pub plan: String,
}

/// What serves a loaded network now.
#[derive(Clone)]
pub enum Current {
    Ready(Arc<Deployed>),
    /// Being re-planned; the deployment it had, if any.
    Healing(Option<Arc<Deployed>>),
    /// No worker set that remains can run it.
    Broken(String),
}

/// A network a client loaded: what it asked for (to plan it again) and its
/// current deployment.
pub struct Loaded {
    /// The id clients use.
    pub id: u64,
    pub name: String,
    pub graph: Graph,
    /// What the client asked (planned again when healing).
    pub(crate) request: LoadRequest,
    pub(crate) model: Bytes,
    pub(crate) current: watch::Sender<Current>,
    /// One re-plan at a time.
    pub(crate) healing: tokio::sync::Mutex<()>,
}

/// What waiting for a deployment gave.
pub enum Waited {
    Ready(Arc<Deployed>),
    Broken(String),
    TimedOut,
}

impl Loaded {
    pub fn new(request: LoadRequest, model: Bytes, deployed: Arc<Deployed>) -> Loaded {
        Loaded {
            id: deployed.network,
            name: request.name.clone(),
            graph: deployed.graph.clone(),
            request,
            model,
            current: watch::Sender::new(Current::Ready(deployed)),
            healing: tokio::sync::Mutex::new(()),
        }
    }

    pub fn current(&self) -> Current {
        self.current.borrow().clone()
    }

    /// The deployment on the workers now (also while healing), if any.
    pub fn deployed(&self) -> Option<Arc<Deployed>> {
        match &*self.current.borrow() {
            Current::Ready(d) | Current::Healing(Some(d)) => Some(d.clone()),
            _ => None,
        }
    }

    /// Waits until a deployment other than `not` serves the network, it
    /// is broken, or `until` passes.
    pub async fn ready(&self, not: Option<u64>, until: Instant) -> Waited {
        let mut rx = self.current.subscribe();
        loop {
            match &*rx.borrow_and_update() {
                Current::Ready(d) if Some(d.id) != not => return Waited::Ready(d.clone()),
                Current::Broken(e) => return Waited::Broken(e.clone()),
                _ => {}
            }
            let until = tokio::time::Instant::from_std(until);
            match tokio::time::timeout_at(until, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Waited::TimedOut,
            }
        }
    }
}
