//! Fitting a plan into the devices' memory: each device's need under the
//! policy's placement, checked against what it offers; when some device
//! is short, the model is cut into pipelined stages by memory and speed
//! ([`crate::memory::pipeline`]) and placed again.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::{PlanError, PlanOptions};
use crate::affinity::{Assignment, CostModel, DeviceId, Rule, SupportSet};
use crate::graph::{Graph, NodeId};
use crate::memory::pipeline::{keep, pipeline, FitRequest, Pipeline, PipelineStage};
use crate::memory::{format_size, MemoryNeed, NeedModel};
use crate::partition::Partition;

/// A re-plan keeps the pipelined placement a network had while it predicts
/// within this share of the best new one.
const KEEP_WITHIN: f64 = 0.10;

/// One device's memory under a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceMemory {
    pub device: String,
    pub need: MemoryNeed,
    /// What it offers (`None`: not limited, or not reported).
    pub offered: Option<u64>,
}

/// Why and how a model was cut by memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pipelined {
    /// What did not fit under the policy's placement.
    pub reason: String,
    /// The stages, in order, each with its device, need and predicted time.
    pub stages: Vec<PipelineStage>,
    /// The slowest stage's predicted time per request, µs.
    pub bottleneck_us: f64,
}

/// A plan's memory: every device's need, and the pipelining if the policy's
/// placement did not fit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanMemory {
    pub devices: Vec<DeviceMemory>,
    /// Each subgraph's need, by subgraph id.
    #[serde(default)]
    pub subgraphs: Vec<MemoryNeed>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipelined: Option<Pipelined>,
}

/// A device whose need exceeds what it offers.
struct Short {
    device: DeviceId,
    need: MemoryNeed,
    offered: u64,
}

/// Each subgraph's need under `partition`.
fn subgraph_needs(need: &NeedModel, partition: &Partition) -> Vec<MemoryNeed> {
    partition
        .subgraphs
        .iter()
        .map(|sg| need.subgraph_need(&sg.nodes, &sg.outputs))
        .collect()
}

/// Each device's need under `partition`, with what it offers.
fn needs(
    need: &NeedModel,
    partition: &Partition,
    budgets: &HashMap<DeviceId, u64>,
) -> (Vec<DeviceMemory>, Option<Short>) {
    let mut short = None;
    let devices = need
        .device_needs(partition)
        .into_iter()
        .map(|(d, n)| {
            let device = &partition.devices[d as usize];
            let offered = budgets.get(device).copied();
            if let Some(have) = offered.filter(|&h| n.total() > h) {
                short.get_or_insert(Short {
                    device: device.clone(),
                    need: n,
                    offered: have,
                });
            }
            DeviceMemory {
                device: device.to_string(),
                need: n,
                offered,
            }
        })
        .collect();
    (devices, short)
}

/// A placement and its partition, fitted into memory.
pub(super) struct Fitted {
    pub assignment: Assignment,
    pub partition: Partition,
    pub memory: PlanMemory,
}

/// The pipelined stages: the previous placement while it still fits and
/// predicts within [`KEEP_WITHIN`] of the best new cut, else that cut.
fn stages(
    request: &FitRequest,
    previous: &BTreeMap<String, DeviceId>,
) -> Result<Pipeline, PlanError> {
    let best = pipeline(request).map_err(|e| PlanError::Memory(Box::new(e)))?;
    let graph = request.need.graph();
    let previous: BTreeMap<NodeId, DeviceId> = previous
        .iter()
        .filter_map(|(name, d)| Some((graph.op_by_name(name)?, d.clone())))
        .collect();
    let kept = (!previous.is_empty())
        .then(|| keep(request, &previous))
        .flatten()
        .filter(|p| p.bottleneck_us <= best.bottleneck_us * (1.0 + KEEP_WITHIN));
    Ok(kept.unwrap_or(best))
}

/// `assignment`/`partition` as the policy made them if every device holds
/// its share; otherwise the model cut into pipelined stages that fit.
pub(super) fn fit(
    graph: &Graph,
    supports: &HashMap<DeviceId, SupportSet>,
    cost: &dyn CostModel,
    options: &PlanOptions,
    manual: &BTreeMap<NodeId, DeviceId>,
    placed: (Assignment, Partition),
) -> Result<Fitted, PlanError> {
    let need = NeedModel::new(graph, options.max_batch, &options.state);
    let (devices, short) = needs(&need, &placed.1, &options.memory);
    let Some(short) = short else {
        let subgraphs = subgraph_needs(&need, &placed.1);
        return Ok(Fitted {
            assignment: placed.0,
            partition: placed.1,
            memory: PlanMemory {
                devices,
                subgraphs,
                pipelined: None,
            },
        });
    };
    let reason = format!(
        "the {} placement needs {} on {}, which offers {}",
        options.policy,
        short.need,
        short.device,
        format_size(short.offered)
    );
    if !manual.is_empty() {
        return Err(PlanError::ManualDoesNotFit(reason));
    }
    let request = FitRequest {
        need: &need,
        devices: &options.priority.devices,
        supports,
        budgets: &options.memory,
        cost,
    };
    let cut = stages(&request, &options.previous)?;
    let stage_of: HashMap<String, usize> = cut
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| (s.device.clone(), i))
        .collect();
    // (The subgraphs do not depend on the rules the explanations name.)
    let (mut assignment, partition) = super::place(graph, supports, cost, options, &cut.placement)?;
    for e in &mut assignment.explanations {
        if let Some(device) = cut.placement.get(&e.node) {
            e.rule = Rule::Memory {
                stage: stage_of.get(&device.to_string()).copied().unwrap_or(0) + 1,
            };
        }
    }
    let (devices, still_short) = needs(&need, &partition, &options.memory);
    if let Some(s) = still_short {
        return Err(PlanError::PipelineShort(format!(
            "{reason}; cut into stages, {} still needs {}, which offers {}",
            s.device,
            s.need,
            format_size(s.offered)
        )));
    }
    let stages = cut.stages.len();
    let subgraphs = subgraph_needs(&need, &partition);
    Ok(Fitted {
        assignment,
        partition,
        memory: PlanMemory {
            devices,
            subgraphs,
            pipelined: Some(Pipelined {
                reason: format!(
                    "{reason}: cut into {stages} pipelined stages, each fitting its device, \
                     balanced by the devices' measured speed"
                ),
                stages: cut.stages,
                bottleneck_us: cut.bottleneck_us,
            }),
        },
    })
}
