//! Following the leading coordinator (HA: `--coordinator a:7400,b:7400`).
//! A worker registers with whichever listed coordinator leads (a standby
//! answers with the leader's address), and watches every listed one for
//! news of a new leader (`WatchLeader`): when a standby takes over it says
//! so at once, and the worker leaves its old session for it without
//! waiting for QUIC to notice the old leader is gone.
//!
//! Fencing: the worker keeps the newest epoch it has seen (registrations
//! and leader news) and refuses any coordinator operation, or
//! registration, with an older one: a coordinator that lost its lead
//! changes nothing here. With one coordinator listed, the epoch is the
//! session's (a coordinator restarted without its state starts again at
//! 1 and is served).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tessera_common::wire::cluster::{CoordinatorAnswer, WorkerReport};
use tessera_net::{exchange, Peer};

use super::State;

/// How long dialling one of several coordinators may take before the next
/// is tried (a dead one does not answer at all).
pub(super) const DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// The newest leader this worker heard of.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct LeaderNews {
    pub epoch: u64,
    /// Its address, as listed or as a standby named it.
    pub addr: Option<String>,
}

/// The coordinators this worker follows, and what it knows of who leads.
pub(super) struct Leaders {
    /// The listed coordinators, `host:port`.
    pub list: Vec<String>,
    /// The newest epoch seen: operations with an older one are refused.
    newest: AtomicU64,
    pub news: tokio::sync::watch::Sender<LeaderNews>,
}

impl Leaders {
    /// From `--coordinator`: one address or several, comma-separated.
    pub fn new(coordinators: &str) -> Leaders {
        Leaders {
            list: coordinators
                .split(',')
                .map(|a| a.trim().to_string())
                .filter(|a| !a.is_empty())
                .collect(),
            newest: AtomicU64::new(0),
            news: tokio::sync::watch::Sender::new(LeaderNews::default()),
        }
    }

    /// Several coordinators (HA).
    pub fn ha(&self) -> bool {
        self.list.len() > 1
    }

    pub fn newest(&self) -> u64 {
        self.newest.load(Ordering::SeqCst)
    }

    /// A registration answered with `epoch`: whether to take it (HA: not
    /// older than the newest seen); the newest becomes it.
    pub fn registered(&self, epoch: u64) -> bool {
        if self.ha() && epoch < self.newest() {
            return false;
        }
        if self.ha() {
            self.newest.fetch_max(epoch, Ordering::SeqCst);
        } else {
            self.newest.store(epoch, Ordering::SeqCst);
        }
        true
    }

    /// Whether an operation with `epoch` may run.
    pub fn allows(&self, epoch: u64) -> bool {
        operation_allowed(epoch, self.newest())
    }

    /// A coordinator said `addr` leads with `epoch`.
    fn heard(&self, epoch: u64, addr: Option<String>) {
        self.newest.fetch_max(epoch, Ordering::SeqCst);
        self.news.send_if_modified(|n| {
            let newer = epoch > n.epoch;
            if newer {
                *n = LeaderNews { epoch, addr };
            }
            newer
        });
    }

    /// The order to try the coordinators in: the one named leader first.
    pub fn order(&self) -> Vec<String> {
        let hint = self.news.borrow().addr.clone();
        dial_order(&self.list, hint.as_deref())
    }
}

/// An operation's epoch against the newest this worker saw.
pub(super) fn operation_allowed(epoch: u64, newest: u64) -> bool {
    epoch >= newest
}

/// `hint` first (when named), then the list in its order, once each.
pub(super) fn dial_order(list: &[String], hint: Option<&str>) -> Vec<String> {
    let mut order: Vec<String> = hint.map(str::to_string).into_iter().collect();
    for addr in list {
        if !order.contains(addr) {
            order.push(addr.clone());
        }
    }
    order
}

/// Watches every listed coordinator for leader news, for as long as the
/// worker runs (HA only).
pub(super) fn spawn_watches(state: &Arc<State>, name: &str) {
    if !state.leaders.ha() {
        return;
    }
    for addr in state.leaders.list.clone() {
        let (state, name) = (state.clone(), name.to_string());
        tokio::spawn(async move {
            loop {
                if let Err(e) = watch_one(&state, &name, &addr).await {
                    tracing::debug!(coordinator = %addr, "leader watch: {e}");
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }
}

/// One `WatchLeader` stream, until it ends.
async fn watch_one(state: &State, name: &str, addr: &str) -> Result<(), String> {
    let resolved = tessera_net::resolve(addr)
        .await
        .map_err(|e| e.to_string())?;
    let dial = tokio::time::timeout(DIAL_TIMEOUT, state.node.dial(resolved));
    let Peer {
        connection,
        mut send,
        mut recv,
        ..
    } = dial
        .await
        .map_err(|_| "no answer".to_string())?
        .map_err(|e| e.to_string())?;
    let limits = *state.node.limits();
    let watch = WorkerReport::WatchLeader {
        name: name.to_string(),
    };
    exchange::send_message(&mut send, &watch, None, &limits)
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let answer = exchange::answer::<CoordinatorAnswer>(&mut recv, &limits, |_| {}).await;
        match answer.map_err(|e| e.to_string())? {
            CoordinatorAnswer::Leading { epoch } => {
                state.leaders.heard(epoch, Some(addr.to_string()))
            }
            CoordinatorAnswer::Standby {
                leader: Some(leader),
                epoch,
            } => state.leaders.heard(epoch, Some(leader)),
            other => tracing::trace!(coordinator = %addr, "leader watch: {other:?}"),
        }
        if connection.close_reason().is_some() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_epoch_is_refused_once_a_newer_one_is_known() {
        let ha = Leaders::new("a:7400, b:7400");
        assert!(ha.ha());
        assert!(ha.registered(10));
        assert!(ha.allows(10) && ha.allows(11));
        ha.heard(20, Some("b:7400".into()));
        // The old leader's operations and registration: refused.
        assert!(!ha.allows(10));
        assert!(!ha.registered(10));
        assert!(ha.registered(20) && ha.allows(20));
        assert_eq!(ha.order(), vec!["b:7400".to_string(), "a:7400".to_string()]);
        // Older news changes nothing.
        ha.heard(15, Some("a:7400".into()));
        assert_eq!(ha.news.borrow().epoch, 20);
        // One coordinator: its epoch is the session's, even a smaller one
        // (it restarted without its state).
        let one = Leaders::new("a:7400");
        assert!(!one.ha());
        assert!(one.registered(5));
        assert!(one.registered(1));
        assert!(one.allows(1));
    }

    #[test]
    fn the_named_leader_is_dialled_first_and_each_address_once() {
        let list = vec!["a:1".to_string(), "b:1".to_string()];
        assert_eq!(dial_order(&list, None), list);
        assert_eq!(dial_order(&list, Some("b:1")), vec!["b:1", "a:1"]);
        assert_eq!(dial_order(&list, Some("c:1")), vec!["c:1", "a:1", "b:1"]);
    }
}
