//! What the cost model predicts for a planned copy of a network: each
//! stage's compute and input-transfer time, each device's busy time per
//! request (its stages' compute plus the transfers into them, which its
//! host receives and decodes), the copy's latency along its stage graph
//! and its throughput bound (one request per busiest device's time).

use std::collections::BTreeMap;

use crate::affinity::{tensor_bytes, CostModel, DeviceId};
use crate::graph::Graph;
use crate::plan::Plan;

/// Predicted time of one stage (subgraph) per request, µs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageCost {
    pub compute_us: f64,
    /// Moving its inputs from the stages that make them (graph inputs,
    /// which come from the client, are not counted).
    pub transfer_us: f64,
}

/// Each stage's predicted cost, in the plan's stage order.
pub fn stage_costs(graph: &Graph, plan: &Plan, cost: &dyn CostModel) -> Vec<StageCost> {
    let part = &plan.partition;
    part.subgraphs
        .iter()
        .map(|sg| {
            let device = part.device_of(sg);
            let compute_us = sg
                .nodes
                .iter()
                .map(|&n| cost.compute_us(graph, n, device))
                .sum();
            let transfer_us = sg
                .inputs
                .iter()
                .map(|&t| {
                    let producer = graph.tensor(t).producer;
                    let from = part.subgraph_of[producer.index()]
                        .map(|i| part.device_of(&part.subgraphs[i]));
                    from.map_or(0.0, |from| {
                        cost.transfer_us(tensor_bytes(graph, t), from, device)
                    })
                })
                .sum();
            StageCost {
                compute_us,
                transfer_us,
            }
        })
        .collect()
}

/// What one planned copy costs per request.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyCost {
    /// Busy time per request of each device the copy uses, µs.
    pub device_us: BTreeMap<DeviceId, f64>,
    /// The busiest device's time: one request per this long at most.
    pub bottleneck_us: f64,
    /// From inputs to the last output along the stage graph, µs.
    pub latency_us: f64,
}

impl CopyCost {
    /// Requests per second the copy can sustain when pipelined.
    pub fn throughput_rps(&self) -> f64 {
        if self.bottleneck_us > 0.0 && self.bottleneck_us.is_finite() {
            1e6 / self.bottleneck_us
        } else {
            0.0
        }
    }
}

/// The cost of a planned copy.
pub fn copy_cost(graph: &Graph, plan: &Plan, cost: &dyn CostModel) -> CopyCost {
    let stages = stage_costs(graph, plan, cost);
    let mut device_us: BTreeMap<DeviceId, f64> = BTreeMap::new();
    for (sg, c) in plan.partition.subgraphs.iter().zip(&stages) {
        let device = plan.partition.device_of(sg).clone();
        *device_us.entry(device).or_default() += c.compute_us + c.transfer_us;
    }
    let bottleneck_us = device_us.values().copied().fold(0.0, f64::max);
    // Stages come in topological order: each finishes after the latest
    // of the stages it reads, plus its own transfer and compute.
    let mut finish = vec![0.0f64; stages.len()];
    for (i, c) in stages.iter().enumerate() {
        let ready = plan
            .stages
            .get(i)
            .map(|s| s.deps.iter().filter(|&&d| d < i).map(|&d| finish[d]))
            .into_iter()
            .flatten()
            .fold(0.0, f64::max);
        finish[i] = ready + c.transfer_us + c.compute_us;
    }
    CopyCost {
        device_us,
        bottleneck_us,
        latency_us: finish.iter().copied().fold(0.0, f64::max),
    }
}
