//! A network's routing table as its requester holds it: subscribed from
//! the coordinator (a `Routes` stream that brings every change), kept when
//! the coordinator goes away (the workers keep serving; the stream is
//! opened again with back-off), and read by each request to pick a copy
//! and reach its workers. Picking and waiting are here; the request path
//! is in [`crate::infer`]; when to publish, ask again, back off or give
//! up is decided in `subscription`.

mod subscription;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_common::wire::client::{ClientReply, ClientRequest};
use tessera_common::wire::control::ErrorKind;
use tessera_common::wire::routes::{CopyRoute, CopyState, DeploymentRoute, RoutingTable};
use tessera_net::{exchange, recv_frame};
use tokio::sync::watch;

use crate::{Client, ClientError, Operation};
use subscription::{Ended, Heard, Next, Resubscribe};

/// What the requester knows of a network's routes.
#[derive(Debug, Clone)]
pub struct Known {
    pub table: Option<Arc<RoutingTable>>,
    /// The network was unloaded (or the named model is gone): why.
    pub gone: Option<String>,
    /// What kind of failure that is.
    pub gone_kind: ErrorKind,
}

impl Default for Known {
    fn default() -> Known {
        Known {
            table: None,
            gone: None,
            gone_kind: ErrorKind::NotFound,
        }
    }
}

/// A subscription to one network's (or named model's) routing table. The
/// task that keeps it ends when the last clone is dropped.
#[derive(Clone)]
pub struct Routes {
    rx: watch::Receiver<Known>,
    _task: Arc<AbortOnDrop>,
    /// This requester's requests in flight per deployment.
    outstanding: Arc<Mutex<HashMap<u64, u32>>>,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Routes {
    /// Subscribes to `network`'s table (or named model `model`'s) and
    /// waits for the first.
    pub async fn subscribe(
        client: &Client,
        network: u64,
        model: Option<String>,
    ) -> Result<Routes, ClientError> {
        let (tx, mut rx) = watch::channel(Known::default());
        let task = tokio::spawn(keep(client.clone(), network, model, tx));
        let routes = Routes {
            rx: rx.clone(),
            _task: Arc::new(AbortOnDrop(task)),
            outstanding: Default::default(),
        };
        let first = {
            let wait = rx.wait_for(|k| k.table.is_some() || k.gone.is_some());
            match tokio::time::timeout(Duration::from_secs(30), wait).await {
                Ok(Ok(known)) => Some(known.clone()),
                _ => None,
            }
        };
        match first {
            Some(known) if known.table.is_some() => Ok(routes),
            Some(known) => Err(ClientError::Failed {
                op: Operation::Routes,
                kind: known.gone_kind,
                message: known.gone.unwrap_or_default(),
            }),
            None => Err(ClientError::Connection(
                "no routing table from the coordinator within 30 s".into(),
            )),
        }
    }

    /// The table now.
    pub fn table(&self) -> Option<Arc<RoutingTable>> {
        self.rx.borrow().table.clone()
    }

    /// Why the network is gone, if it is.
    pub fn gone(&self) -> Option<String> {
        self.rx.borrow().gone.clone()
    }

    /// A watch of the table, for waiting on changes.
    pub fn watch(&self) -> watch::Receiver<Known> {
        self.rx.clone()
    }

    /// Waits until the table changes or `until` passes; false if it did
    /// not change (or the network is gone).
    pub async fn changed(&self, until: Instant) -> bool {
        let mut rx = self.rx.clone();
        rx.borrow_and_update();
        let until = tokio::time::Instant::from_std(until);
        matches!(
            tokio::time::timeout_at(until, rx.changed()).await,
            Ok(Ok(()))
        ) && self.gone().is_none()
    }

    /// Counts a request on `deployment` until the guard drops.
    pub fn start_work(&self, deployment: u64) -> Working {
        if let Ok(mut all) = self.outstanding.lock() {
            *all.entry(deployment).or_default() += 1;
        }
        Working {
            outstanding: self.outstanding.clone(),
            deployment,
        }
    }

    fn outstanding(&self, deployment: u64) -> u32 {
        self.outstanding
            .lock()
            .ok()
            .and_then(|all| all.get(&deployment).copied())
            .unwrap_or(0)
    }

    /// The ready copy with the least outstanding work (requests on it ×
    /// its predicted latency, counting this requester's and what its
    /// workers reported) whose deployment is not in `tried` (and that is
    /// `only`, if given); waits for one until `until`.
    pub async fn pick(&self, tried: &[u64], only: Option<u32>, until: Instant) -> Picked {
        let mut rx = self.rx.clone();
        loop {
            let known = rx.borrow_and_update().clone();
            if let Some(why) = known.gone {
                return Picked::Gone(why, known.gone_kind);
            }
            if let Some(table) = &known.table {
                if let Some(picked) = self.best(table, tried, only) {
                    return picked;
                }
            }
            let wait = tokio::time::Instant::from_std(until);
            match tokio::time::timeout_at(wait, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Picked::TimedOut,
            }
        }
    }

    fn best(&self, table: &Arc<RoutingTable>, tried: &[u64], only: Option<u32>) -> Option<Picked> {
        let mut best: Option<(f64, &CopyRoute, &DeploymentRoute)> = None;
        let mut broken = Vec::new();
        let copies = table
            .copies
            .iter()
            .filter(|c| only.is_none_or(|i| i == c.index));
        let count = copies.clone().count();
        for copy in copies {
            match (&copy.state, &copy.deployment) {
                (CopyState::Ready, Some(d)) if !tried.contains(&d.id) => {
                    let mine = self.outstanding(d.id);
                    let queued = mine.max(copy.load.queued);
                    let work = f64::from(queued + 1) * d.predicted_latency_us.max(1.0);
                    if best.as_ref().is_none_or(|(w, _, _)| work < *w) {
                        best = Some((work, copy, d));
                    }
                }
                (CopyState::Broken(why), _) => broken.push(why.clone()),
                _ => {}
            }
        }
        if let Some((_, copy, d)) = best {
            return Some(Picked::Ready {
                table: table.clone(),
                copy: copy.index,
                deployment: d.clone(),
            });
        }
        if !broken.is_empty() && broken.len() == count {
            broken.dedup();
            return Some(Picked::Broken(broken.join("; ")));
        }
        None
    }

    /// After a try on `deployment` (copy `copy`) could not reach a worker:
    /// waits until that copy runs another deployment, is broken, or
    /// `until` passes (the worker was not lost).
    pub async fn settled(&self, copy: u32, deployment: u64, until: Instant) -> Settled {
        let mut rx = self.rx.clone();
        loop {
            let state = {
                let known = rx.borrow_and_update();
                if let Some(why) = &known.gone {
                    return Settled::Broken(why.clone());
                }
                known.table.as_ref().and_then(|t| {
                    t.copies
                        .iter()
                        .find(|c| c.index == copy)
                        .map(|c| (c.state.clone(), c.deployment.as_ref().map(|d| d.id)))
                })
            };
            match state {
                Some((CopyState::Broken(why), _)) => return Settled::Broken(why),
                Some((CopyState::Ready, Some(id))) if id != deployment => {
                    return Settled::Redeployed
                }
                Some((CopyState::Healing, _)) => return Settled::Redeployed,
                _ => {}
            }
            let wait = tokio::time::Instant::from_std(until);
            match tokio::time::timeout_at(wait, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return Settled::Unchanged,
            }
        }
    }
}

/// A request counted on a deployment (see [`Routes::start_work`]).
pub struct Working {
    outstanding: Arc<Mutex<HashMap<u64, u32>>>,
    deployment: u64,
}

impl Drop for Working {
    fn drop(&mut self) {
        if let Ok(mut all) = self.outstanding.lock() {
            if let Some(n) = all.get_mut(&self.deployment) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

/// The copy a request goes to.
pub enum Picked {
    Ready {
        table: Arc<RoutingTable>,
        copy: u32,
        deployment: DeploymentRoute,
    },
    /// Every copy is broken: why.
    Broken(String),
    /// The network is gone: why, and what kind of failure it is.
    Gone(String, ErrorKind),
    TimedOut,
}

pub use tessera_common::requests::tries::Settled;

/// Keeps `tx` up to date from the coordinator: a `Routes` stream, opened
/// again when it breaks, as [`Resubscribe`] decides; the last table stays
/// meanwhile.
async fn keep(client: Client, network: u64, model: Option<String>, tx: watch::Sender<Known>) {
    let mut resubscribe = Resubscribe::new();
    loop {
        resubscribe.opened(Instant::now());
        let followed = follow(&client, network, model.clone(), &tx).await;
        let ended = match followed {
            Ok(()) => Ended::Gone,
            Err(_) => Ended::Broke,
        };
        let Next::AskAgainAfter(wait) = resubscribe.ended(ended, !tx.is_closed(), Instant::now())
        else {
            return;
        };
        if let Err(e) = followed {
            tracing::debug!(
                network,
                ?model,
                "routing table stream: {e}; again in {wait:?}"
            );
        }
        tokio::time::sleep(wait).await;
        client.reconnect_if_closed().await;
    }
}

/// One `Routes` stream: every table it brings, as [`Heard::of`] reads its
/// frames; `Ok` once the network is gone.
async fn follow(
    client: &Client,
    network: u64,
    model: Option<String>,
    tx: &watch::Sender<Known>,
) -> Result<(), ClientError> {
    let limits = client.limits();
    let (mut send, mut recv) = exchange::open(&client.connection())
        .await
        .map_err(ClientError::Transport)?;
    let msg = ClientRequest::Routes { network, model };
    exchange::send_message(&mut send, &msg, None, &limits)
        .await
        .map_err(ClientError::Transport)?;
    let _ = send.finish();
    loop {
        let frame = recv_frame::<ClientReply>(&mut recv, &limits)
            .await
            .map_err(ClientError::Transport)?;
        match Heard::of(frame) {
            Heard::Table(table) => tx.send_modify(|k| {
                k.table = Some(Arc::new(*table));
                k.gone = None;
            }),
            Heard::Gone(why, kind) => {
                tx.send_modify(|k| {
                    k.gone = Some(why);
                    k.gone_kind = kind;
                });
                return Ok(());
            }
            Heard::NotLeader => {
                client.not_leader();
                return Err(ClientError::Connection("the coordinator stands by".into()));
            }
            Heard::Broken(e) => return Err(e),
        }
    }
}
