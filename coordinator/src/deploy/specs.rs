//! Each exported stage made a shipment: its worker, its `DeploySpec`
//! (routes from each output to its readers, batching, state) and its
//! model; and the check that a sequence's state stays on one worker.

use tessera_common::onnx::parts::Part;
use tessera_common::plan::{io_names, Stage};
use tessera_common::wire::control::{DeploySpec, Destination, LoadRequest, Route, StatePair};
use tessera_common::wire::pieces;

use super::deployment::host_of;
use super::export::Exported;
use crate::network::SubgraphModel;
use crate::planning::Planned;
use crate::CoordinatorError;

/// One subgraph to deploy: its host, its spec and its model, as pieces
/// (see [`encode_model_parts`]: the weights are the coordinator's own
/// bytes).
///
/// [`encode_model_parts`]: tessera_common::onnx::parts::encode_model_parts
pub(super) struct Shipment {
    pub host: String,
    pub spec: DeploySpec,
    pub model: Vec<Part>,
}

impl Shipment {
    /// What a worker must hold of it to be adopted.
    pub fn model(&self) -> SubgraphModel {
        SubgraphModel {
            host: self.host.clone(),
            subgraph: self.spec.subgraph,
            model_hash: self.spec.model_hash.clone(),
        }
    }
}

/// Each subgraph's deployment: its host, its spec (with routes: each output
/// to the workers whose subgraphs read it, and back to the request's
/// requester when it is a graph output, and where the model was read
/// from, `source`) and its model, `exported`.
pub(super) fn deploy_specs(
    planned: &Planned,
    deployment: u64,
    request: &LoadRequest,
    exported: Vec<Exported>,
    source: Option<&str>,
) -> Result<Vec<Shipment>, CoordinatorError> {
    let batching = request.batching;
    let stages = &planned.plan.stages;
    let pairs = planned.graph.state_pairs().unwrap_or_default();
    if request.generation.is_some() {
        check_state_kept(stages, &pairs)?;
    }
    let generation = request.generation.as_ref();
    let max_sequences = generation.map_or(0, |g| g.max_sequences);
    let max_queued = generation.map_or(0, |g| g.max_queued);
    let queue_timeout_ms = generation.map_or(0, |g| g.queue_timeout_ms);
    let (_, output_names) = io_names(planned.graph);
    let addr_of = |host: &str| {
        planned
            .by_host
            .get(host)
            .map(|(w, _)| w.data_addr.clone())
            .unwrap_or_default()
    };
    let route = |t: &String| {
        let mut to: Vec<Destination> = Vec::new();
        for reader in stages.iter().filter(|s| s.inputs.contains(t)) {
            let host = host_of(&reader.device);
            let addr = addr_of(&host);
            let dest = Destination::Worker { name: host, addr };
            if !to.contains(&dest) {
                to.push(dest);
            }
        }
        if output_names.contains(t) {
            to.push(Destination::Requester);
        }
        Route {
            tensor: t.clone(),
            to,
        }
    };
    stages
        .iter()
        .zip(exported)
        .enumerate()
        .map(|(i, (stage, exported))| {
            let Exported {
                parts: model,
                pieces,
                model_hash,
            } = exported;
            let spec = DeploySpec {
                network: deployment,
                subgraph: i as u32,
                device: stage.device.name.clone(),
                model_hash,
                model_bytes: pieces::model_len(&pieces),
                pieces,
                inputs: stage.inputs.clone(),
                outputs: stage.outputs.iter().map(route).collect(),
                // A subgraph of constants only runs once per trigger.
                batching: batching.filter(|_| !stage.inputs.is_empty()),
                state: pairs
                    .iter()
                    .filter(|p| {
                        stage.inputs.contains(&p.past) || stage.outputs.contains(&p.present)
                    })
                    .cloned()
                    .collect(),
                max_sequences,
                max_queued,
                queue_timeout_ms,
                source: source.map(str::to_string),
            };
            Ok(Shipment {
                host: host_of(&stage.device),
                spec,
                model,
            })
        })
        .collect()
}

/// Each state pair's state must stay on one worker: the stages that read
/// its input and the one that makes its output run on the same host.
fn check_state_kept(stages: &[Stage], pairs: &[StatePair]) -> Result<(), CoordinatorError> {
    for pair in pairs {
        let mut hosts: Vec<String> = stages
            .iter()
            .filter(|s| s.inputs.contains(&pair.past) || s.outputs.contains(&pair.present))
            .map(|s| host_of(&s.device))
            .collect();
        hosts.dedup();
        if hosts.len() > 1 {
            return Err(CoordinatorError::Plan(format!(
                "the state {} → {} would be split over workers {}; a sequence's state must \
                 stay on one worker",
                pair.present,
                pair.past,
                hosts.join(", ")
            )));
        }
    }
    Ok(())
}
