//! The partition validator: the invariants every partition must satisfy,
//! whichever algorithm produced it.

use super::Partition;
use crate::affinity::Assignment;
use crate::graph::{Graph, NodeKind};

/// A broken partition invariant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("node '{0}' is in {1} subgraphs (expected exactly one)")]
    NodeCount(String, usize),
    #[error("subgraph {sg} holds node '{node}' of another device")]
    MixedDevice { sg: usize, node: String },
    #[error("subgraph {0} has no op nodes (housekeeping alone)")]
    Empty(usize),
    #[error("subgraph {0} has id {1}")]
    BadId(usize, usize),
    #[error("the subgraphs form a cycle through subgraph {0}")]
    Cycle(usize),
    #[error("tensor '{tensor}' crosses from subgraph {from} to {to} but is not {what}")]
    Boundary {
        tensor: String,
        from: usize,
        to: usize,
        what: &'static str,
    },
    #[error("subgraph {sg} lacks housekeeping node '{node}' ({kind})")]
    Housekeeping {
        sg: usize,
        node: String,
        kind: &'static str,
    },
    #[error("graph output '{0}' is neither produced by a subgraph nor a pass-through")]
    LostOutput(String),
}

/// Checks: every op node in exactly one subgraph; one device per subgraph
/// (the assigned one); no empty subgraph; the subgraph graph is acyclic and
/// ids follow a topological order; every tensor crossing a boundary is an
/// output of its producer's subgraph and an input of each consumer's;
/// Parameters, Constants and Results are attached where they are used.
pub fn validate(
    graph: &Graph,
    assignment: &Assignment,
    p: &Partition,
) -> Result<(), ValidationError> {
    check_membership(graph, assignment, p)?;
    let mut output_of = vec![usize::MAX; graph.tensors.len()];
    for (i, sg) in p.subgraphs.iter().enumerate() {
        for &t in &sg.outputs {
            output_of[t.index()] = i;
        }
    }
    check_boundaries(graph, p, &output_of)?;
    check_graph_outputs(graph, p, &output_of)
}

/// Ids in order, no empty subgraph, every op node in exactly one subgraph
/// of its assigned device.
fn check_membership(
    graph: &Graph,
    assignment: &Assignment,
    p: &Partition,
) -> Result<(), ValidationError> {
    let mut count = vec![0usize; graph.dag.node_count()];
    for (i, sg) in p.subgraphs.iter().enumerate() {
        if sg.id != i {
            return Err(ValidationError::BadId(i, sg.id));
        }
        if sg.nodes.is_empty() {
            return Err(ValidationError::Empty(i));
        }
        for &n in &sg.nodes {
            count[n.index()] += 1;
            if assignment.device_of[n.index()] != Some(sg.device)
                || p.subgraph_of[n.index()] != Some(i)
            {
                return Err(ValidationError::MixedDevice {
                    sg: i,
                    node: graph.node(n).name.clone(),
                });
            }
        }
    }
    for &n in graph.topo_ops() {
        if count[n.index()] != 1 {
            return Err(ValidationError::NodeCount(
                graph.node(n).name.clone(),
                count[n.index()],
            ));
        }
    }
    Ok(())
}

/// Acyclic with topological ids (every crossing edge goes to a higher id);
/// every crossing tensor an output of its producer's subgraph
/// (`output_of`) and an input of its consumer's; Parameters and Constants
/// attached where they are read.
fn check_boundaries(
    graph: &Graph,
    p: &Partition,
    output_of: &[usize],
) -> Result<(), ValidationError> {
    // Stamps (subgraph id + 1) stand for per-subgraph sets.
    let mut input_stamp = vec![0usize; graph.tensors.len()];
    let mut node_stamp = vec![0usize; graph.dag.node_count()];
    for (to, sg) in p.subgraphs.iter().enumerate() {
        let stamp = to + 1;
        for &t in &sg.inputs {
            input_stamp[t.index()] = stamp;
        }
        for &n in sg.parameters.iter().chain(&sg.constants) {
            node_stamp[n.index()] = stamp;
        }
        for &n in &sg.nodes {
            let node = graph.node(n);
            for &t in node.inputs.iter().flatten().chain(&node.implicit_inputs) {
                let producer = graph.tensor(t).producer;
                let name = || graph.tensor(t).name.clone();
                let boundary = |from, what| ValidationError::Boundary {
                    tensor: name(),
                    from,
                    to,
                    what,
                };
                let housekeeping = |kind| ValidationError::Housekeeping {
                    sg: to,
                    node: name(),
                    kind,
                };
                match graph.node(producer).kind {
                    NodeKind::Op => {
                        let from = p.subgraph_of[producer.index()].unwrap_or(usize::MAX);
                        if from == to {
                            continue;
                        }
                        if from > to {
                            return Err(ValidationError::Cycle(to));
                        }
                        if output_of[t.index()] != from {
                            return Err(boundary(from, "an output of its producer's subgraph"));
                        }
                        if input_stamp[t.index()] != stamp {
                            return Err(boundary(from, "an input of its consumer's subgraph"));
                        }
                    }
                    NodeKind::Parameter
                        if node_stamp[producer.index()] != stamp
                            || input_stamp[t.index()] != stamp =>
                    {
                        return Err(housekeeping("Parameter"));
                    }
                    NodeKind::Constant if node_stamp[producer.index()] != stamp => {
                        return Err(housekeeping("Constant"));
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// Every graph output made by a subgraph that outputs it, or passed
/// through.
fn check_graph_outputs(
    graph: &Graph,
    p: &Partition,
    output_of: &[usize],
) -> Result<(), ValidationError> {
    for &t in &graph.outputs {
        let producer = graph.tensor(t).producer;
        match p.subgraph_of[producer.index()] {
            Some(sg) => {
                if output_of[t.index()] != sg {
                    return Err(ValidationError::Housekeeping {
                        sg,
                        node: graph.tensor(t).name.clone(),
                        kind: "Result",
                    });
                }
            }
            None if p.passthrough_outputs.contains(&t) => {}
            None => return Err(ValidationError::LostOutput(graph.tensor(t).name.clone())),
        }
    }
    Ok(())
}
