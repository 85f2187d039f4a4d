//! A worker leaving on purpose (SIGTERM: `WorkerReport::Draining`). Unlike
//! a loss, nothing it runs fails: from the moment it says so nothing new
//! is planned on it; each copy deployed on it is planned and deployed again
//! without it while the old deployment goes on serving, the copy switches
//! to the new one (requesters get the new routing table and send new
//! requests there), and the old deployment is undeployed once it holds
//! nothing (no request queued or running, no sequence kept: `IdleWatch`)
//! or after [`IDLE_LIMIT`]. Then the coordinator closes the worker's
//! session, which tells it that it may exit. A copy that cannot move (no
//! other worker can run it) stays where it is; it heals as after a loss
//! once the worker is gone.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::network::{Current, Deployed, Loaded, Replica};
use crate::Shared;

/// The longest an old deployment is kept for what it still holds.
pub const IDLE_LIMIT: Duration = Duration::from_secs(15);

/// Heartbeats in a row that must see an old deployment idle: a request
/// between two stages shows on neither, but not for a whole heartbeat.
const IDLE_BEATS: u32 = 2;

/// Worker `name` said it is leaving.
pub fn worker_draining(shared: &Arc<Shared>, name: &str) {
    let Some(entry) = shared.workers.get(name).map(|e| e.clone()) else {
        return;
    };
    if entry.draining.swap(true, Ordering::Relaxed) {
        return;
    }
    let copies = crate::heal::copies_on(shared, name);
    tracing::info!(worker = %name, copies = copies.len(), "worker draining: moving what it runs");
    let shared = shared.clone();
    let name = name.to_string();
    tokio::spawn(async move {
        let moves = copies
            .into_iter()
            .map(|(loaded, replica)| move_copy(&shared, loaded, replica, &name));
        futures_util::future::join_all(moves).await;
        tessera_net::CloseCode::Dropped.close(&entry.connection, "drained");
    });
}

/// Deploys `replica` of `loaded` again without worker `leaving`, switches
/// to it, and undeploys the old deployment once idle.
async fn move_copy(
    shared: &Arc<Shared>,
    loaded: Arc<Loaded>,
    replica: Arc<Replica>,
    leaving: &str,
) {
    let one_at_a_time = replica.healing.lock().await;
    let Current::Ready(old) = replica.current() else {
        return;
    };
    if !old.hosts.iter().any(|h| h == leaving) || shared.shutting_down() {
        return;
    }
    let started = Instant::now();
    let new = match crate::heal::redeploy(shared, &loaded, &replica).await {
        Ok(Some(new)) => new,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(network = loaded.id, replica = replica.index, worker = %leaving,
                "cannot move off the draining worker (it heals once the worker is gone): {e}");
            return;
        }
    };
    replica.placed(&new);
    // Requests in flight on the old deployment finish there.
    replica.set_retiring(old.id, true);
    replica.current.send_replace(Current::Ready(new.clone()));
    shared.metrics.replanned(&loaded.name);
    shared.state.save_network(&loaded).await;
    tracing::info!(
        network = loaded.id,
        replica = replica.index,
        deployment = new.id,
        hosts = %new.hosts.join(","),
        took_ms = started.elapsed().as_millis() as u64,
        "network moved off draining worker {leaving}"
    );
    // The copy is whole again: another re-plan (a second worker
    // draining, a loss) need not wait for the old deployment to empty.
    drop(one_at_a_time);
    wait_idle(shared, &old).await;
    crate::deploy::undeploy(shared, old.id, &old.hosts).await;
    replica.set_retiring(old.id, false);
}

/// Waits until `old` holds nothing on any worker, as their heartbeats say,
/// or [`IDLE_LIMIT`].
async fn wait_idle(shared: &Shared, old: &Deployed) {
    let beat = Duration::from_millis(shared.config.heartbeat_ms);
    // Requesters have the new table at once; in-flight requests show in
    // the next heartbeats.
    tokio::time::sleep(beat).await;
    let started = Instant::now();
    let mut watch = IdleWatch::default();
    loop {
        let holds = crate::routes::reported_loads(shared)
            .get(&old.id)
            .map(|l| l.queued + l.sequences)
            .unwrap_or(0);
        match watch.observe(holds, started.elapsed()) {
            Idle::Yes => return,
            Idle::GaveUp => {
                tracing::warn!(
                    deployment = old.id,
                    holds,
                    "undeploying a drained copy that still holds requests after {IDLE_LIMIT:?}"
                );
                return;
            }
            Idle::Not => tokio::time::sleep(beat).await,
        }
    }
}

/// Whether an old deployment is done, heartbeat after heartbeat.
#[derive(Debug, Default)]
struct IdleWatch {
    /// Heartbeats in a row that saw it hold nothing.
    idle_beats: u32,
}

#[derive(Debug, PartialEq, Eq)]
enum Idle {
    Yes,
    Not,
    /// [`IDLE_LIMIT`] passed with it still holding something.
    GaveUp,
}

impl IdleWatch {
    /// One reading: what it `holds` now, `waited` since the watch began.
    fn observe(&mut self, holds: u32, waited: Duration) -> Idle {
        self.idle_beats = if holds == 0 { self.idle_beats + 1 } else { 0 };
        if self.idle_beats >= IDLE_BEATS {
            Idle::Yes
        } else if waited >= IDLE_LIMIT {
            Idle::GaveUp
        } else {
            Idle::Not
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_deployment_is_done_after_two_idle_heartbeats_or_the_limit() {
        let s = Duration::from_secs;
        let mut watch = IdleWatch::default();
        assert_eq!(watch.observe(0, s(0)), Idle::Not, "one idle beat");
        assert_eq!(watch.observe(3, s(1)), Idle::Not, "busy again");
        assert_eq!(watch.observe(0, s(2)), Idle::Not);
        assert_eq!(watch.observe(0, s(3)), Idle::Yes);
        let mut busy = IdleWatch::default();
        assert_eq!(busy.observe(1, s(14)), Idle::Not);
        assert_eq!(busy.observe(1, IDLE_LIMIT), Idle::GaveUp);
        // Idle at the limit still counts as done, not given up.
        let mut late = IdleWatch::default();
        late.observe(0, s(14));
        assert_eq!(late.observe(0, IDLE_LIMIT), Idle::Yes);
    }
}
