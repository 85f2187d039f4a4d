//! Dumps of affinity and partition decisions: GraphViz `.dot` (as OpenVINO's
//! HETERO_DUMP_GRAPH_DOT) and JSON.
//!
//! The JSON written as `<model>_subgraphs.json` has this stable form, read by
//! other tools:
//! `{"subgraphs": [{"id", "device", "nodes", "inputs", "outputs"}, ...],
//!   "affinity": {"node": "DEVICE", ...}}`, plus `"passthrough_outputs"` and
//! `"explanations"` (node → devices that support it and the rule that chose).

use std::fmt::Write;

use serde_json::{json, Value};

use crate::affinity::Assignment;
use crate::graph::{Graph, NodeKind};
use crate::partition::Partition;

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

/// The `_subgraphs.json` document.
pub fn subgraphs_json(graph: &Graph, a: &Assignment, p: &Partition) -> Value {
    let names = |ts: &[crate::graph::TensorId]| -> Vec<&str> {
        ts.iter().map(|&t| graph.tensor(t).name.as_str()).collect()
    };
    let subgraphs: Vec<Value> = p
        .subgraphs
        .iter()
        .map(|sg| {
            json!({
                "id": sg.id,
                "device": p.device_of(sg).to_string(),
                "nodes": sg.nodes.iter().map(|&n| graph.node(n).name.as_str()).collect::<Vec<_>>(),
                "inputs": names(&sg.inputs),
                "outputs": names(&sg.outputs),
                "depends_on": p.dependencies(graph, sg),
            })
        })
        .collect();
    let mut affinity = serde_json::Map::new();
    let mut explanations = serde_json::Map::new();
    for e in &a.explanations {
        let name = graph.node(e.node).name.clone();
        affinity.insert(
            name.clone(),
            json!(a.devices[e.device as usize].to_string()),
        );
        let rule = serde_json::to_value(&e.rule).unwrap_or_else(|_| json!({"rule": "unknown"}));
        explanations.insert(
            name,
            json!({
                "supported_on": e.supported_on.iter().map(|&d| a.devices[d as usize].to_string()).collect::<Vec<_>>(),
                "decision": rule,
            }),
        );
    }
    json!({
        "subgraphs": subgraphs,
        "affinity": affinity,
        "passthrough_outputs": names(&p.passthrough_outputs),
        "explanations": explanations,
    })
}
