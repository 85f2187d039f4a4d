//! Scheduling on a simulated cluster: hosts with CPUs and some GPUs of
//! different speeds, links of different bandwidths and latencies, all
//! from a seeded generator (the same seed gives the same cluster on any
//! machine). [`simulate`] schedules a network on it and compares the
//! predicted throughput with an upper bound: every device running whole
//! copies at its own speed, the work spread with no transfer and no idle
//! device (the sum over devices of one request per the device's time for
//! the whole network).

use std::collections::HashMap;
use std::time::Instant;

use super::{schedule, Cluster, Considered, Replicas, ScheduleError};
use crate::affinity::{
    AnalyticCostModel, CostModel, DeviceId, DevicePriority, DeviceProfile, LinkProfile, Policy,
    SupportSet,
};
use crate::graph::Graph;
use crate::memory::NeedModel;
use crate::plan::PlanOptions;
use crate::synth::Rng;

/// A generated cluster.
pub struct SimulatedCluster {
    /// Every device, host by host (`w0/CPU`, `w0/GPU`, `w1/CPU`, ...).
    pub devices: Vec<DeviceId>,
    pub cost: AnalyticCostModel,
    pub supports: HashMap<DeviceId, SupportSet>,
}

/// Uniform in `lo..hi` on a log scale.
fn log_uniform(rng: &mut Rng, lo: f64, hi: f64) -> f64 {
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    (lo.ln() + u * (hi.ln() - lo.ln())).exp()
}

/// `workers` hosts: each a CPU (20–400 GFLOP/s, 10–60 GB/s), one in four
/// also a GPU (500–8,000 GFLOP/s, 100–900 GB/s) that cannot run one of the
/// graph's op types; each host's link 0.1–12.5 GB/s with 20–2,000 µs
/// latency (all log-uniform).
pub fn cluster(graph: &Graph, workers: usize, seed: u64) -> SimulatedCluster {
    let mut rng = Rng::new(seed);
    let mut op_types: Vec<String> = graph
        .topo_ops()
        .iter()
        .map(|&n| graph.node(n).op_type.clone())
        .collect();
    op_types.sort();
    op_types.dedup();
    let mut cost = AnalyticCostModel::default();
    let mut devices = Vec::new();
    let mut supports = HashMap::new();
    for w in 0..workers {
        let host = format!("w{w}");
        let cpu = DeviceId {
            host: Some(host.clone()),
            name: "CPU".into(),
            index: None,
        };
        let profile = DeviceProfile {
            gflops: log_uniform(&mut rng, 20.0, 400.0),
            mem_gbps: log_uniform(&mut rng, 10.0, 60.0),
            launch_us: 2.0,
        };
        cost.devices.insert(cpu.clone(), profile);
        supports.insert(cpu.clone(), SupportSet::all());
        devices.push(cpu);
        if rng.chance(0.25) {
            let gpu = DeviceId {
                host: Some(host.clone()),
                name: "GPU".into(),
                index: None,
            };
            let profile = DeviceProfile {
                gflops: log_uniform(&mut rng, 500.0, 8_000.0),
                mem_gbps: log_uniform(&mut rng, 100.0, 900.0),
                launch_us: 10.0,
            };
            cost.devices.insert(gpu.clone(), profile);
            let lacking = op_types
                .get(rng.below(op_types.len().max(1) as u64) as usize)
                .cloned();
            let support = SupportSet {
                op_types: op_types
                    .iter()
                    .filter(|t| Some(*t) != lacking.as_ref())
                    .cloned()
                    .collect(),
                ..Default::default()
            };
            supports.insert(gpu.clone(), support);
            devices.push(gpu);
        }
        let link = LinkProfile {
            gbps: log_uniform(&mut rng, 0.1, 12.5),
            latency_us: log_uniform(&mut rng, 20.0, 2_000.0),
        };
        cost.host_links.insert(host, link);
    }
    SimulatedCluster {
        devices,
        cost,
        supports,
    }
}

/// What a simulation found.
#[derive(Debug, Clone)]
pub struct SimulationReport {
    pub workers: usize,
    pub devices: usize,
    /// Scheduling time (planning every candidate copy), ms.
    pub planning_ms: f64,
    pub copies: usize,
    /// Copies split over more than one device.
    pub split_copies: usize,
    /// The most devices one copy is split over.
    pub most_stages: usize,
    pub predicted_rps: f64,
    /// Every device running whole copies at its own speed.
    pub upper_bound_rps: f64,
    pub considered: Vec<Considered>,
}

impl SimulationReport {
    /// Predicted throughput as a share of the upper bound.
    pub fn efficiency(&self) -> f64 {
        if self.upper_bound_rps > 0.0 {
            self.predicted_rps / self.upper_bound_rps
        } else {
            0.0
        }
    }
}

/// Schedules `graph` as `replicas` over a generated cluster of `workers`
/// hosts (cost policy inside each copy).
pub fn simulate(
    graph: &Graph,
    workers: usize,
    seed: u64,
    replicas: Replicas,
) -> Result<SimulationReport, ScheduleError> {
    let sim = cluster(graph, workers, seed);
    schedule_on(graph, &sim, replicas, HashMap::new())
}

/// As [`simulate`], every device's memory limited so that one copy of the
/// model needs about `hosts` hosts' memory: each device offers the model's
/// need / `hosts`, times 0.7–1.4 (log-uniform, seeded). Copies are then cut
/// into pipelined stages by memory and speed.
pub fn simulate_with_memory(
    graph: &Graph,
    workers: usize,
    seed: u64,
    replicas: Replicas,
    hosts: f64,
) -> Result<SimulationReport, ScheduleError> {
    let sim = cluster(graph, workers, seed);
    let need = NeedModel::new(graph, 1, &Default::default())
        .subgraph_need(graph.topo_ops(), &graph.outputs)
        .total() as f64;
    let mut rng = Rng::new(seed ^ 0x6d65_6d6f_7279);
    let memory = sim
        .devices
        .iter()
        .map(|d| {
            (
                d.clone(),
                (need / hosts * log_uniform(&mut rng, 0.7, 1.4)) as u64,
            )
        })
        .collect();
    schedule_on(graph, &sim, replicas, memory)
}

/// Schedules `graph` on a generated cluster whose devices offer `memory`.
fn schedule_on(
    graph: &Graph,
    sim: &SimulatedCluster,
    replicas: Replicas,
    memory: HashMap<DeviceId, u64>,
) -> Result<SimulationReport, ScheduleError> {
    let workers = sim.cost.host_links.len();
    let options = PlanOptions {
        priority: DevicePriority {
            devices: sim.devices.clone(),
        },
        policy: Policy::Cost,
        memory,
        ..Default::default()
    };
    let on = Cluster {
        graph,
        supports: &sim.supports,
        cost: &sim.cost,
    };
    let started = Instant::now();
    let planned = schedule(&on, &options, replicas)?;
    let planning_ms = started.elapsed().as_secs_f64() * 1e3;
    let upper_bound_rps = sim
        .devices
        .iter()
        .map(|d| {
            let whole: f64 = graph
                .topo_ops()
                .iter()
                .map(|&n| sim.cost.compute_us(graph, n, d))
                .sum();
            if whole > 0.0 {
                1e6 / whole
            } else {
                0.0
            }
        })
        .sum();
    Ok(SimulationReport {
        workers,
        devices: sim.devices.len(),
        planning_ms,
        copies: planned.copies.len(),
        split_copies: planned
            .copies
            .iter()
            .filter(|c| c.cost.device_us.len() > 1)
            .count(),
        most_stages: planned
            .copies
            .iter()
            .map(|c| c.cost.device_us.len())
            .max()
            .unwrap_or(0),
        predicted_rps: planned.predicted_rps,
        upper_bound_rps,
        considered: planned.considered,
    })
}
