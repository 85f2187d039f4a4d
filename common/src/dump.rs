//! Dumps of affinity and partition decisions: GraphViz `.dot` (as OpenVINO's
//! HETERO_DUMP_GRAPH_DOT) and JSON.
//!
//! The JSON written as `<model>_subgraphs.json` is a [`PlanReport`], of this
//! stable form, read by other tools:
//! `{"subgraphs": [{"id", "device", "nodes", "inputs", "outputs",
//!   "depends_on"}, ...], "affinity": {"node": "DEVICE", ...}}`, plus
//! `"passthrough_outputs"`, `"explanations"` (node → devices that support it
//! and the rule that chose) and `"simplified"`.

use std::fmt::Write;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::affinity::{Assignment, DeviceIdx, Rule};
use crate::graph::{Graph, NodeKind};
use crate::partition::Partition;
use crate::simplify::SimplifyReport;

const PALETTE: [&str; 8] = [
    "#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5", "#ffffb3",
];

fn color(device: usize) -> &'static str {
    PALETTE[device % PALETTE.len()]
}

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn node_label(graph: &Graph, n: crate::graph::NodeId) -> String {
    let node = graph.node(n);
    match node.kind {
        NodeKind::Op => format!("{}\\n{}", node.name, node.op_type),
        _ => format!("{}\\n({:?})", node.name, node.kind),
    }
    .replace('"', "'")
}

fn write_edges(out: &mut String, graph: &Graph) {
    for e in graph.dag.raw_edges() {
        let _ = writeln!(
            out,
            "  n{} -> n{} [label={}{}];",
            e.source().index(),
            e.target().index(),
            quote(&graph.tensor(e.weight.tensor).type_string()),
            if e.weight.implicit {
                ", style=dashed"
            } else {
                ""
            }
        );
    }
}

/// `<model>_affinity.dot`: every node coloured by its device.
pub fn affinity_dot(graph: &Graph, a: &Assignment) -> String {
    let mut out = String::from("digraph affinity {\n  node [shape=box, style=filled];\n");
    for (i, d) in a.devices.iter().enumerate() {
        let _ = writeln!(
            out,
            "  legend{i} [label={}, fillcolor=\"{}\", shape=note];",
            quote(&d.to_string()),
            color(i)
        );
    }
    for n in graph.dag.node_indices() {
        let fill = a.device_of[n.index()]
            .map(|d| color(d as usize))
            .unwrap_or("#eeeeee");
        let shape = if graph.node(n).kind == NodeKind::Op {
            "box"
        } else {
            "ellipse"
        };
        let _ = writeln!(
            out,
            "  n{} [label=\"{}\", fillcolor=\"{fill}\", shape={shape}];",
            n.index(),
            node_label(graph, n)
        );
    }
    write_edges(&mut out, graph);
    out.push_str("}\n");
    out
}

/// `<model>_subgraphs.dot`: one cluster per subgraph, labelled with its id,
/// device and host.
pub fn subgraphs_dot(graph: &Graph, p: &Partition) -> String {
    let mut out =
        String::from("digraph subgraphs {\n  compound=true;\n  node [shape=box, style=filled];\n");
    for sg in &p.subgraphs {
        let device = p.device_of(sg);
        let host = device.host.as_deref().unwrap_or("local");
        let _ = writeln!(out, "  subgraph cluster_{} {{", sg.id);
        let _ = writeln!(
            out,
            "    label={};",
            quote(&format!("subgraph {}: {} @ {}", sg.id, device, host))
        );
        let _ = writeln!(
            out,
            "    style=filled; fillcolor=\"{}40\";",
            color(sg.device as usize)
        );
        for &n in sg.nodes.iter().chain(&sg.results) {
            let _ = writeln!(
                out,
                "    n{} [label=\"{}\", fillcolor=\"{}\"];",
                n.index(),
                node_label(graph, n),
                color(sg.device as usize)
            );
        }
        out.push_str("  }\n");
    }
    for n in graph.dag.node_indices() {
        let node = graph.node(n);
        if matches!(node.kind, NodeKind::Parameter | NodeKind::Constant)
            || (node.kind == NodeKind::Result
                && !p.subgraphs.iter().any(|s| s.results.contains(&n)))
        {
            let _ = writeln!(
                out,
                "  n{} [label=\"{}\", shape=ellipse, fillcolor=\"#eeeeee\"];",
                n.index(),
                node_label(graph, n)
            );
        }
    }
    write_edges(&mut out, graph);
    out.push_str("}\n");
    out
}

/// The plan document: what `<model>_subgraphs.json` holds (partition,
/// affinity, explanations), and, from the coordinator, where each subgraph
/// runs and what the cost model predicts for it. Written and read as JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanReport {
    pub subgraphs: Vec<SubgraphReport>,
    /// Node name → `DEVICE` (`host/DEVICE` in a cluster).
    pub affinity: BTreeMap<String, String>,
    /// Graph outputs that are graph inputs or constants (no subgraph makes
    /// them).
    #[serde(default)]
    pub passthrough_outputs: Vec<String>,
    /// Node name → why it runs where it does.
    #[serde(default)]
    pub explanations: BTreeMap<String, NodeExplanation>,
    /// The loaded network (0 for a dry run or a local plan).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub network: u64,
    /// Workers the plan runs on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// What simplification folded and removed before planning.
    #[serde(default)]
    pub simplified: SimplifyReport,
    /// Every copy of the network (replicas), when there is more than one;
    /// `subgraphs` above are the first copy's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaReport>,
    /// Predicted requests per second of all copies together (0: not
    /// predicted).
    #[serde(default)]
    pub predicted_rps: f64,
    /// With `replicas = auto`: each count of copies weighed and what the
    /// cost model predicts for it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub considered: Vec<crate::schedule::Considered>,
    /// Each device's memory need and offer, and, when the policy's
    /// placement did not fit, how the model was cut by memory and speed.
    #[serde(default)]
    pub memory: crate::plan::PlanMemory,
}

/// One copy of a network.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicaReport {
    /// The deployment serving it (0 in a dry run).
    #[serde(default)]
    pub deployment: u64,
    /// Workers it runs on.
    pub hosts: Vec<String>,
    /// Its subgraphs' devices, in subgraph order.
    pub devices: Vec<String>,
    /// Predicted time from inputs to outputs, µs.
    pub predicted_latency_us: f64,
    /// Predicted requests per second when pipelined.
    pub predicted_rps: f64,
    /// Its subgraphs' runs, in subgraph order (a loaded network's plan).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measured: Vec<Option<MeasuredRuns>>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// One subgraph of a plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubgraphReport {
    pub id: usize,
    /// `DEVICE`, or `host/DEVICE` in a cluster.
    pub device: String,
    /// Node names, in topological order.
    pub nodes: Vec<String>,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// Subgraphs whose outputs it reads.
    #[serde(default)]
    pub depends_on: Vec<usize>,
    /// The worker it runs on (a cluster's plan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The cost model's estimates: compute on its device, and moving its
    /// inputs from their producers' devices (µs; 0 where not predicted).
    #[serde(default)]
    pub predicted_compute_us: f64,
    #[serde(default)]
    pub predicted_transfer_us: f64,
    /// Its memory need (weights, activations, state).
    #[serde(default)]
    pub memory: crate::memory::MemoryNeed,
    /// Each node's op type, in `nodes`' order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub op_types: Vec<String>,
    /// Each input's bytes per request, in `inputs`' order: from its
    /// shape, a dimension the model leaves open counted as the cost
    /// model's default (an estimate).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_bytes: Vec<u64>,
    /// Measured on its worker since it was deployed (the coordinator's
    /// plan of a loaded network; absent before any heartbeat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<MeasuredRuns>,
}

/// A deployed subgraph's runs, from its worker's heartbeats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MeasuredRuns {
    pub runs: u64,
    pub failed: u64,
    /// Compute time over all runs, µs.
    pub busy_us: u64,
    /// Requests it holds now.
    pub depth: u32,
}

impl MeasuredRuns {
    /// Mean compute time of a run, µs (0 before the first).
    pub fn us_per_run(&self) -> f64 {
        match self.runs {
            0 => 0.0,
            n => self.busy_us as f64 / n as f64,
        }
    }
}

/// Why a node runs where it does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeExplanation {
    /// Devices that support it, in priority order.
    pub supported_on: Vec<String>,
    /// The rule that chose its device.
    pub decision: Rule,
}

/// The plan document of a partition.
pub fn plan_report(graph: &Graph, a: &Assignment, p: &Partition) -> PlanReport {
    let names = |ts: &[crate::graph::TensorId]| -> Vec<String> {
        ts.iter().map(|&t| graph.tensor(t).name.clone()).collect()
    };
    let subgraphs = p
        .subgraphs
        .iter()
        .map(|sg| SubgraphReport {
            id: sg.id,
            device: p.device_of(sg).to_string(),
            nodes: sg
                .nodes
                .iter()
                .map(|&n| graph.node(n).name.clone())
                .collect(),
            op_types: sg
                .nodes
                .iter()
                .map(|&n| graph.node(n).op_type.clone())
                .collect(),
            input_bytes: sg
                .inputs
                .iter()
                .map(|&t| crate::affinity::cost::tensor_bytes(graph, t))
                .collect(),
            inputs: names(&sg.inputs),
            outputs: names(&sg.outputs),
            depends_on: p.dependencies(graph, sg),
            ..Default::default()
        })
        .collect();
    let device = |d: DeviceIdx| a.devices[d as usize].to_string();
    let mut affinity = BTreeMap::new();
    let mut explanations = BTreeMap::new();
    for e in &a.explanations {
        let name = graph.node(e.node).name.clone();
        affinity.insert(name.clone(), device(e.device));
        let why = NodeExplanation {
            supported_on: e.supported_on.iter().map(|&d| device(d)).collect(),
            decision: e.rule.clone(),
        };
        explanations.insert(name, why);
    }
    PlanReport {
        subgraphs,
        affinity,
        passthrough_outputs: names(&p.passthrough_outputs),
        explanations,
        ..Default::default()
    }
}
