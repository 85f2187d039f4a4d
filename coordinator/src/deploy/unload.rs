//! Undeploying a deployment from its workers, and unloading a network.

use std::sync::Arc;

use tessera_common::wire::cluster::ToWorker;

use crate::{CoordinatorError, Shared};

/// Stops a deployment's subgraphs on its workers that are still connected.
pub async fn undeploy(shared: &Arc<Shared>, network: u64, hosts: &[String]) {
    for host in hosts {
        let Some(worker) = shared.workers.get(host).map(|w| w.clone()) else {
            continue;
        };
        let msg = ToWorker::Undeploy {
            network,
            epoch: worker.epoch,
        };
        if let Err(e) = worker.ask(shared.node.limits(), &msg, None, None).await {
            tracing::warn!("undeploy network {network}: {e}");
        }
    }
}

/// Unloads a network.
pub async fn unload(shared: &Arc<Shared>, network: u64) -> Result<(), CoordinatorError> {
    let (_, loaded) = shared
        .networks
        .remove(&network)
        .ok_or(CoordinatorError::UnknownNetwork(network))?;
    shared.repository.network_unloaded(network);
    shared.state.remove_network(network).await;
    crate::state::save_models(shared).await;
    for deployed in loaded.deployments() {
        undeploy(shared, deployed.id, &deployed.hosts).await;
    }
    Ok(())
}
