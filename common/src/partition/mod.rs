//! Subgraph selection: cutting the assigned graph into acyclic, multi-output
//! subgraphs, one device each.
//!
//! Two algorithms behind one interface ([`Algorithm`]): `fast` (default, a
//! near-linear topological pass, see [`fast`]) and `reference` (OpenVINO's
//! algorithm, see [`reference`]). Both are followed by [`merge`] (optional),
//! then the subgraphs are numbered in a topological order, housekeeping nodes
//! are attached (Parameters and Constants to every subgraph that reads them,
//! Results to the subgraph that produces them) and boundary tensors become
//! subgraph inputs and outputs. [`validate`] checks the result.

mod dag;
pub mod fast;
pub mod merge;
pub mod reference;
mod validate;

use std::collections::{HashMap, HashSet};

pub use dag::OpDag;
pub use validate::{validate, ValidationError};

use crate::affinity::{Assignment, DeviceId, DeviceIdx};
use crate::graph::{Graph, NodeId, NodeKind, TensorId};

/// Which selection algorithm to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    #[default]
    Fast,
    Reference,
}

impl std::str::FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fast" => Ok(Algorithm::Fast),
            "reference" => Ok(Algorithm::Reference),
            other => Err(format!("unknown algorithm '{other}' (expected fast or reference)")),
        }
    }
}

impl Algorithm {
    /// Subgraph labels per op node of `dag`.
    pub fn select(self, dag: &OpDag) -> Vec<u32> {
        match self {
            Algorithm::Fast => fast::select(dag),
            Algorithm::Reference => reference::select(dag),
        }
    }
}

/// Options of [`partition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOptions {
    pub algorithm: Algorithm,
    /// Run the merge pass after selection.
    pub merge: bool,
}

impl Default for PartitionOptions {
    fn default() -> Self {
        PartitionOptions { algorithm: Algorithm::Fast, merge: true }
    }
}

/// One subgraph: op nodes of one device plus attached housekeeping nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subgraph {
    /// Position in [`Partition::subgraphs`]; ids follow a topological order.
    pub id: usize,
    pub device: DeviceIdx,
    /// Op nodes, in topological order.
    pub nodes: Vec<NodeId>,
    /// Graph inputs this subgraph reads.
    pub parameters: Vec<NodeId>,
    /// Initializers this subgraph reads (copied into it on export).
    pub constants: Vec<NodeId>,
    /// Graph outputs this subgraph produces.
    pub results: Vec<NodeId>,
    /// Tensors entering: graph inputs and other subgraphs' outputs.
    pub inputs: Vec<TensorId>,
    /// Tensors leaving: graph outputs and tensors other subgraphs read.
    pub outputs: Vec<TensorId>,
}

/// A partition of a graph into subgraphs.
#[derive(Debug, Clone)]
pub struct Partition {
    pub devices: Vec<DeviceId>,
    pub subgraphs: Vec<Subgraph>,
    /// Subgraph of each op node, indexed by `NodeId::index()`.
    pub subgraph_of: Vec<Option<usize>>,
    /// Graph outputs that are graph inputs or initializers: no subgraph
    /// computes them; the runtime returns them directly.
    pub passthrough_outputs: Vec<TensorId>,
}

impl Partition {
    pub fn device_of(&self, sg: &Subgraph) -> &DeviceId {
        &self.devices[sg.device as usize]
    }

    /// Ids of the subgraphs whose outputs `sg` reads.
    pub fn dependencies(&self, graph: &Graph, sg: &Subgraph) -> Vec<usize> {
        let mut deps: Vec<usize> = sg
            .inputs
            .iter()
            .filter_map(|&t| self.subgraph_of[graph.tensor(t).producer.index()])
            .collect();
        deps.sort_unstable();
        deps.dedup();
        deps
    }
}

/// Why a partition could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("node '{0}' has no device assigned")]
    Unassigned(String),
    #[error("internal error, the partition is invalid: {0}")]
    Invalid(#[from] ValidationError),
}

/// The op DAG of `graph` with the devices of `assignment`.
pub fn op_dag(graph: &Graph, assignment: &Assignment) -> Result<OpDag, PartitionError> {
    let ops = graph.topo_ops();
    let mut index = vec![u32::MAX; graph.dag.node_count()];
    for (i, &id) in ops.iter().enumerate() {
        index[id.index()] = i as u32;
    }
    let device = ops
        .iter()
        .map(|&id| assignment.device_of[id.index()].ok_or_else(|| PartitionError::Unassigned(graph.node(id).name.clone())))
        .collect::<Result<Vec<_>, _>>()?;
    let mut edges = Vec::with_capacity(graph.dag.edge_count());
    for e in graph.dag.raw_edges() {
        let (a, b) = (index[e.source().index()], index[e.target().index()]);
        if a != u32::MAX && b != u32::MAX {
            edges.push((a, b));
        }
    }
    Ok(OpDag::new(device, edges))
}

/// Partitions `graph` according to `assignment`.
pub fn partition(graph: &Graph, assignment: &Assignment, options: PartitionOptions) -> Result<Partition, PartitionError> {
    let dag = op_dag(graph, assignment)?;
    let mut labels = options.algorithm.select(&dag);
    if options.merge {
        labels = merge::merge(&dag, &labels);
    }
    let p = assemble(graph, &assignment.devices, &dag, &labels);
    validate(graph, assignment, &p)?;
    Ok(p)
}

/// Builds subgraphs from per-op labels: numbers them topologically and
/// attaches housekeeping nodes and boundary tensors.
pub fn assemble(graph: &Graph, devices: &[DeviceId], dag: &OpDag, labels: &[u32]) -> Partition {
    let ops = graph.topo_ops();
    // Dense group numbers in order of first appearance.
    let mut dense: HashMap<u32, usize> = HashMap::new();
    let mut group = Vec::with_capacity(labels.len());
    for &l in labels {
        let next = dense.len();
        group.push(*dense.entry(l).or_insert(next));
    }
    let k = dense.len();
    // Topological order of the groups (Kahn; lowest first-appearance first).
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); k];
    let mut indeg = vec![0usize; k];
    let mut edges: Vec<(usize, usize)> = (0..dag.len() as u32)
        .flat_map(|v| dag.succs(v).iter().map(move |&s| (v, s)))
        .map(|(v, s)| (group[v as usize], group[s as usize]))
        .filter(|(a, b)| a != b)
        .collect();
    edges.sort_unstable();
    edges.dedup();
    for (a, b) in edges {
        succ[a].push(b);
        indeg[b] += 1;
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> =
        (0..k).filter(|&g| indeg[g] == 0).map(std::cmp::Reverse).collect();
    let mut id_of = vec![usize::MAX; k];
    let mut next_id = 0;
    while let Some(std::cmp::Reverse(g)) = ready.pop() {
        id_of[g] = next_id;
        next_id += 1;
        for &s in &succ[g] {
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(std::cmp::Reverse(s));
            }
        }
    }
    // A cycle would leave groups unnumbered; number them anyway so that the
    // validator reports it instead of losing nodes.
    for g in 0..k {
        if id_of[g] == usize::MAX {
            id_of[g] = next_id;
            next_id += 1;
        }
    }
    let mut subgraphs: Vec<Subgraph> = (0..k)
        .map(|id| Subgraph {
            id,
            device: 0,
            nodes: Vec::new(),
            parameters: Vec::new(),
            constants: Vec::new(),
            results: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
        })
        .collect();
    let mut subgraph_of = vec![None; graph.dag.node_count()];
    for (i, &node) in ops.iter().enumerate() {
        let id = id_of[group[i]];
        subgraph_of[node.index()] = Some(id);
        subgraphs[id].device = dag.device[i];
        subgraphs[id].nodes.push(node);
    }
    // Lists are kept in first-use order; `seen` makes each push O(1).
    let mut seen: HashSet<(usize, List, u32)> = HashSet::new();
    let mut push = |sg: &mut Subgraph, list: List, x: u32| {
        if seen.insert((sg.id, list, x)) {
            match list {
                List::Parameters => sg.parameters.push(NodeId::new(x as usize)),
                List::Constants => sg.constants.push(NodeId::new(x as usize)),
                List::Inputs => sg.inputs.push(TensorId(x)),
                List::Outputs => sg.outputs.push(TensorId(x)),
            }
        }
    };
    for &node in ops {
        let id = subgraph_of[node.index()].unwrap_or(0);
        for t in graph.node(node).all_inputs() {
            let producer = graph.tensor(t).producer;
            let p = producer.index() as u32;
            match graph.node(producer).kind {
                NodeKind::Parameter => {
                    push(&mut subgraphs[id], List::Parameters, p);
                    push(&mut subgraphs[id], List::Inputs, t.0);
                }
                NodeKind::Constant => push(&mut subgraphs[id], List::Constants, p),
                NodeKind::Op => {
                    let from = subgraph_of[producer.index()].unwrap_or(0);
                    if from != id {
                        push(&mut subgraphs[id], List::Inputs, t.0);
                        push(&mut subgraphs[from], List::Outputs, t.0);
                    }
                }
                NodeKind::Result => {}
            }
        }
    }
    let mut passthrough_outputs = Vec::new();
    for result in graph.dag.node_indices().filter(|&n| graph.node(n).kind == NodeKind::Result) {
        let Some(t) = graph.node(result).inputs.first().copied().flatten() else { continue };
        let producer = graph.tensor(t).producer;
        match subgraph_of[producer.index()] {
            Some(id) => {
                subgraphs[id].results.push(result);
                push(&mut subgraphs[id], List::Outputs, t.0);
            }
            None if !passthrough_outputs.contains(&t) => passthrough_outputs.push(t),
            None => {}
        }
    }
    Partition { devices: devices.to_vec(), subgraphs, subgraph_of, passthrough_outputs }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum List {
    Parameters,
    Constants,
    Inputs,
    Outputs,
}
