//! Fault tolerance: a loaded network outlives the deployments that serve
//! it. When a worker it runs on is lost, each copy (replica) deployed on
//! that worker is marked as healing while the network's other copies go
//! on serving; it is re-planned onto the workers that remain (of its own
//! workers, when the network has several copies; pins and devices that
//! named the lost worker dropped) and re-deployed (the workers'
//! compiled-subgraph caches make known subgraphs a file read). Requests
//! meanwhile are retried on another copy, or on the new deployment, by
//! [`crate::requests::infer`]. A copy that cannot be re-planned is broken,
//! with an error that says why, until a worker (re)joins and a re-plan
//! succeeds; a network is broken when all its copies are.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_common::affinity::{DeviceId, DevicePriority};
use tessera_common::wire::control::LoadRequest;

use crate::deploy;
use crate::network::{Current, Deployed, Loaded, Replica};
use crate::{CoordinatorError, Shared};

/// Re-plans tried after a loss before a network is declared broken.
const HEAL_TRIES: usize = 3;

/// Worker `name` is gone (already removed from the members): every copy
/// deployed on it starts healing (the network's other copies go on
/// serving). Call before failing its requests, so that their retries find
/// the copies that remain or wait for the new deployment.
pub fn worker_lost(shared: &Arc<Shared>, name: &str) {
    let hit: Vec<(Arc<Loaded>, Arc<Replica>)> = shared
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
        .collect();
    for (loaded, replica) in hit {
        replica.current.send_modify(|c| {
            if let Current::Ready(d) = c {
                *c = Current::Healing(Some(d.clone()));
            }
        });
        let why = format!("worker {name} was lost");
        tokio::spawn(heal(shared.clone(), loaded, replica, why));
    }
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

/// Re-plans and re-deploys one copy of `loaded` (over its own workers
/// that remain) unless its deployment is healthy.
async fn heal(shared: Arc<Shared>, loaded: Arc<Loaded>, replica: Arc<Replica>, why: String) {
    let _one_at_a_time = replica.healing.lock().await;
    let started = Instant::now();
    let mut last = String::new();
    for _ in 0..HEAL_TRIES {
        let old = match replica.current() {
            Current::Ready(d) if healthy(&shared, &d) => return,
            Current::Ready(d) | Current::Healing(Some(d)) => Some(d),
            Current::Healing(None) | Current::Broken(_) => None,
        };
        replica.current.send_replace(Current::Healing(old.clone()));
        if let Some(old) = &old {
            deploy::undeploy(&shared, old.id, &old.hosts).await;
        }
        // The old deployment is gone from the workers from here on.
        replica.current.send_replace(Current::Healing(None));
        let outcome = match without_lost(&shared, &loaded.request) {
            Ok(request) => {
                // Nobody watches a re-plan's progress but the logs.
                let (progress, _) = tokio::sync::mpsc::channel(1);
                let scope = crate::planning::Scope {
                    only: replica.hosts.as_deref(),
                    network: Some(loaded.id),
                    previous: replica.placement(),
                };
                deploy::deploy(&shared, &request, &loaded.model, &scope, progress).await
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(deployed) => {
                if !shared.networks.contains_key(&loaded.id) {
                    // Unloaded meanwhile.
                    deploy::undeploy(&shared, deployed.id, &deployed.hosts).await;
                    return;
                }
                tracing::info!(
                    network = loaded.id,
                    replica = replica.index,
                    deployment = deployed.id,
                    hosts = %deployed.hosts.join(","),
                    took_ms = started.elapsed().as_millis() as u64,
                    "network re-planned ({why})"
                );
                replica.placed(&deployed);
                replica.current.send_replace(Current::Ready(deployed));
                shared.metrics.replanned(&loaded.name);
                return;
            }
            Err(e) => {
                tracing::warn!(
                    network = loaded.id,
                    replica = replica.index,
                    "re-plan failed ({why}): {e}"
                );
                last = e.to_string();
                if matches!(e, CoordinatorError::Devices(_) | CoordinatorError::Plan(_)) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(shared.config.heartbeat_ms)).await;
            }
        }
    }
    let named = if loaded.name.is_empty() {
        String::new()
    } else {
        format!(" ({})", loaded.name)
    };
    let copy = if loaded.replicas.len() > 1 {
        format!(" replica {} of {}", replica.index, loaded.replicas.len())
    } else {
        String::new()
    };
    let error = format!(
        "network {}{named}{copy} cannot run on the workers that remain ({why}): {last}",
        loaded.id
    );
    replica.current.send_replace(Current::Broken(error));
}

/// `request` without the devices and manual pins that name workers no
/// longer connected (their nodes fall to the policy).
pub(crate) fn without_lost(
    shared: &Shared,
    request: &LoadRequest,
) -> Result<LoadRequest, CoordinatorError> {
    let here = |d: &DeviceId| {
        d.host
            .as_ref()
            .is_none_or(|h| shared.workers.contains_key(h))
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
