//! Fault tolerance: a loaded network outlives the deployments that serve
//! it. When a worker it runs on is lost, each copy (replica) deployed on
//! that worker is marked as healing while the network's other copies go
//! on serving; it is re-planned onto the workers that remain (of its own
//! workers, when the network has several copies; pins and devices that
//! named the lost worker dropped) and re-deployed (the workers'
//! compiled-subgraph caches make known subgraphs a file read). The
//! coordinator fails no request: it publishes the copy's new state in the
//! network's routing table, and requesters retry on another copy or on
//! the new deployment. A copy that cannot be re-planned is broken,
//! with an error that says why, until a worker (re)joins and a re-plan
//! succeeds; a network is broken when all its copies are. When to leave a
//! copy, try again or give up is decided in `decide`; this module only
//! undeploys, deploys, sleeps and publishes.

mod decide;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_common::affinity::{DeviceId, DevicePriority};
use tessera_common::wire::control::LoadRequest;

use crate::deploy;
use crate::network::{Current, Deployed, Loaded, Replica};
use crate::{CoordinatorError, Shared};
use decide::{AfterFailure, Heal, Seen, Step};

/// Worker `name` is gone (already removed from the members): every copy
/// deployed on it starts healing (the network's other copies go on
/// serving). Call before failing its requests, so that their retries find
/// the copies that remain or wait for the new deployment.
pub fn worker_lost(shared: &Arc<Shared>, name: &str) {
    for (loaded, replica) in copies_on(shared, name) {
        replan(shared, loaded, replica, format!("worker {name} was lost"));
    }
}

/// Every copy (of every network) deployed on worker `name`.
pub(crate) fn copies_on(shared: &Shared, name: &str) -> Vec<(Arc<Loaded>, Arc<Replica>)> {
    shared
        .networks
        .iter()
        .flat_map(|n| {
            let loaded = n.clone();
            n.replicas
                .iter()
                .filter(|r| {
                    r.deployed()
                        .is_some_and(|d| d.hosts.iter().any(|h| h == name))
                })
                .map(|r| (loaded.clone(), r.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Marks a copy as healing and re-plans it (`why`: for the logs).
pub fn replan(shared: &Arc<Shared>, loaded: Arc<Loaded>, replica: Arc<Replica>, why: String) {
    replica.current.send_modify(|c| {
        if let Current::Ready(d) = c {
            *c = Current::Healing(Some(d.clone()));
        }
    });
    tokio::spawn(heal(shared.clone(), loaded, replica, why));
}

/// A worker (re)joined: broken copies try again.
pub fn worker_joined(shared: &Arc<Shared>, name: &str) {
    let broken: Vec<(Arc<Loaded>, Arc<Replica>)> = shared
        .networks
        .iter()
        .flat_map(|n| {
            let loaded = n.clone();
            n.replicas
                .iter()
                .filter(|r| matches!(r.current(), Current::Broken(_)))
                .map(|r| (loaded.clone(), r.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    for (loaded, replica) in broken {
        let why = format!("worker {name} joined");
        tokio::spawn(heal(shared.clone(), loaded, replica, why));
    }
}

/// Whether every worker of `deployed` is connected.
fn healthy(shared: &Shared, deployed: &Deployed) -> bool {
    deployed
        .hosts
        .iter()
        .all(|h| shared.workers.contains_key(h))
}

/// [`heal_copy`], then keeps the network as it is now.
async fn heal(shared: Arc<Shared>, loaded: Arc<Loaded>, replica: Arc<Replica>, why: String) {
    heal_copy(&shared, &loaded, &replica, why).await;
    if shared.networks.contains_key(&loaded.id) {
        shared.state.save_network(&loaded).await;
    }
}

/// Re-plans and re-deploys one copy of `loaded` (over its own workers
/// that remain) unless its deployment is healthy, as [`Heal`] decides.
async fn heal_copy(shared: &Arc<Shared>, loaded: &Loaded, replica: &Replica, why: String) {
    let _one_at_a_time = replica.healing.lock().await;
    let beat = Duration::from_millis(shared.config.heartbeat_ms);
    let mut heal = Heal::new(Instant::now(), beat);
    loop {
        let current = replica.current();
        let old = match &current {
            Current::Ready(d) | Current::Healing(Some(d)) => Some(d.clone()),
            Current::Healing(None) | Current::Broken(_) => None,
        };
        let healthy = match &current {
            Current::Ready(d) => healthy(shared, d),
            _ => false,
        };
        if heal.look(Seen::of(&current, healthy)) == Step::Leave {
            return;
        }
        replica.current.send_replace(Current::Healing(old.clone()));
        if let Some(old) = &old {
            deploy::undeploy(shared, old.id, &old.hosts).await;
        }
        // The old deployment is gone from the workers from here on.
        replica.current.send_replace(Current::Healing(None));
        let e = match redeploy(shared, loaded, replica).await {
            Ok(None) => return,
            Ok(Some(deployed)) => {
                tracing::info!(
                    network = loaded.id,
                    replica = replica.index,
                    deployment = deployed.id,
                    hosts = %deployed.hosts.join(","),
                    took_ms = heal.placed(Instant::now()).as_millis() as u64,
                    "network re-planned ({why})"
                );
                replica.placed(&deployed);
                replica.current.send_replace(Current::Ready(deployed));
                shared.metrics.replanned(&loaded.name);
                return;
            }
            Err(e) => e,
        };
        tracing::warn!(
            network = loaded.id,
            replica = replica.index,
            "re-plan failed ({why}): {e}"
        );
        let fixed = matches!(e, CoordinatorError::Devices(_) | CoordinatorError::Plan(_));
        match heal.failed(fixed, Instant::now()) {
            AfterFailure::TryAgainAt(at) => {
                tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await
            }
            AfterFailure::GiveUp => {
                let copy = (replica.index, loaded.replicas.len());
                let error = broken(loaded.id, &loaded.name, copy, &why, &e.to_string());
                replica.current.send_replace(Current::Broken(error));
                return;
            }
        }
    }
}

/// Plans and deploys `replica` of `loaded` again over the workers that
/// remain (and are not draining), keeping a placement that still fits;
/// `None` when the network was unloaded meanwhile (the new deployment is
/// undeployed again).
pub(crate) async fn redeploy(
    shared: &Arc<Shared>,
    loaded: &Loaded,
    replica: &Replica,
) -> Result<Option<Arc<Deployed>>, CoordinatorError> {
    let request = without_lost(shared, &loaded.request)?;
    // Nobody watches a re-plan's progress but the logs.
    let (progress, _) = tokio::sync::mpsc::channel(1);
    let source = loaded.source();
    let scope = crate::planning::Scope {
        only: replica.hosts.as_deref(),
        network: Some(loaded.id),
        previous: replica.placement(),
        source: source.as_deref(),
    };
    let model = crate::state::lacking::model_of(shared, loaded).await?;
    let deployed = deploy::deploy(shared, &request, &model, &scope, progress).await?;
    if !shared.networks.contains_key(&loaded.id) {
        deploy::undeploy(shared, deployed.id, &deployed.hosts).await;
        return Ok(None);
    }
    Ok(Some(deployed))
}

/// Why a copy is broken: network `id` (named `name`), copy `(index,
/// copies)`, after `why`, its last re-plan failing with `last`.
fn broken(id: u64, name: &str, (index, copies): (usize, usize), why: &str, last: &str) -> String {
    let named = if name.is_empty() {
        String::new()
    } else {
        format!(" ({name})")
    };
    let copy = if copies > 1 {
        format!(" replica {index} of {copies}")
    } else {
        String::new()
    };
    format!("network {id}{named}{copy} cannot run on the workers that remain ({why}): {last}")
}

/// `request` without the devices and manual pins that name workers no
/// longer connected or leaving (their nodes fall to the policy).
pub(crate) fn without_lost(
    shared: &Shared,
    request: &LoadRequest,
) -> Result<LoadRequest, CoordinatorError> {
    let here = |d: &DeviceId| {
        d.host
            .as_ref()
            .is_none_or(|h| shared.workers.get(h).is_some_and(|w| !w.draining()))
    };
    let mut out = request.clone();
    if !request.devices.trim().is_empty() {
        let priority = DevicePriority::parse(&request.devices)
            .map_err(|e| CoordinatorError::Devices(e.to_string()))?;
        let kept: Vec<String> = priority
            .devices
            .iter()
            .filter(|d| here(d))
            .map(|d| d.to_string())
            .collect();
        if kept.is_empty() {
            return Err(CoordinatorError::Devices(format!(
                "every device it named ({}) is on a lost worker",
                request.devices
            )));
        }
        out.devices = kept.join(",");
    }
    out.affinity
        .retain(|(_, device)| match DeviceId::parse(device) {
            Ok(d) => here(&d),
            Err(_) => true,
        });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_copy_says_which_and_why() {
        assert_eq!(
            broken(3, "rec", (2, 2), "worker b was lost", "no device fits"),
            "network 3 (rec) replica 2 of 2 cannot run on the workers that remain \
             (worker b was lost): no device fits"
        );
        assert_eq!(
            broken(4, "", (1, 1), "worker b was lost", "none left"),
            "network 4 cannot run on the workers that remain (worker b was lost): none left"
        );
    }
}
