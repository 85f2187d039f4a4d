//! Subgraph selection: cutting the assigned graph into acyclic, multi-output
//! subgraphs, one device each.
//!
//! Two algorithms behind one interface ([`Algorithm`]): `fast` (default, a
//! near-linear topological pass, see [`fast`]) and `reference` (OpenVINO's
//! algorithm, see [`mod@reference`]). Both are followed by [`merge`] (optional),
//! then the subgraphs are numbered in a topological order, housekeeping nodes
//! are attached (Parameters and Constants to every subgraph that reads them,
//! Results to the subgraph that produces them) and boundary tensors become
//! subgraph inputs and outputs. [`validate`] checks the result.

mod dag;
pub mod fast;
pub mod merge;
pub mod reference;
mod validate;

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
            other => Err(format!(
                "unknown algorithm '{other}' (expected fast or reference)"
            )),
        }
    }
}

impl Algorithm {
    /// Subgraph labels per op node of `dag`, without the merge pass.
    pub fn select(self, dag: &OpDag) -> Vec<u32> {
        match self {
            Algorithm::Fast => fast::select(dag, fast::JoinRule::Rank),
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
    /// `fast` runs its strategy portfolio on graphs up to this many op
    /// nodes, and the strictly linear variant above.
    pub portfolio_max_nodes: usize,
}

impl Default for PartitionOptions {
    fn default() -> Self {
        PartitionOptions {
            algorithm: Algorithm::Fast,
            merge: true,
            portfolio_max_nodes: PORTFOLIO_MAX_NODES,
        }
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

/// Graphs up to this many op nodes get the whole `fast` portfolio.
pub const PORTFOLIO_MAX_NODES: usize = 50_000;

/// Subgraph labels for `dag`: the algorithm, then the merge pass.
///
/// With the merge pass, `fast` on graphs of up to `portfolio_max_nodes`
/// runs a portfolio of linear strategies and keeps the one with the fewest
/// subgraphs: five starting points (the greedy pass forwards and backwards,
/// each with the exact and the rank-only join rule, and all singletons),
/// each merged in three contraction orders. The greedy choices are local and
/// which one leaves the merge pass most room depends on the graph; on random
/// DAGs the portfolio needs more subgraphs than `reference` in about 5% of
/// cases and fewer in about half. Larger graphs get the forward rank-only
/// pass and the strictly linear [`merge::MergeOrder::Local`] merge.
pub fn select(dag: &OpDag, options: PartitionOptions) -> Vec<u32> {
    if !options.merge {
        return options.algorithm.select(dag);
    }
    if options.algorithm == Algorithm::Reference {
        return merge::merge(dag, &reference::select(dag));
    }
    if dag.len() > options.portfolio_max_nodes {
        return merge::merge_in_order(
            dag,
            &fast::select(dag, fast::JoinRule::Rank),
            merge::MergeOrder::Local,
        );
    }
    let count = |labels: &[u32]| {
        let mut l = labels.to_vec();
        l.sort_unstable();
        l.dedup();
        l.len()
    };
    let reversed = dag.reversed();
    let backwards = |rule| {
        let mut labels = fast::select(&reversed, rule);
        labels.reverse();
        labels
    };
    let starts = [
        fast::select(dag, fast::JoinRule::Rank),
        fast::select(dag, fast::JoinRule::Exact),
        backwards(fast::JoinRule::Rank),
        backwards(fast::JoinRule::Exact),
        (0..dag.len() as u32).collect(),
    ];
    let orders = [
        merge::MergeOrder::DevicePriority,
        merge::MergeOrder::LargestFirst,
        merge::MergeOrder::Window,
    ];
    let mut best: Option<(usize, Vec<u32>)> = None;
    for start in &starts {
        for order in orders {
            let labels = merge::merge_in_order(dag, start, order);
            let k = count(&labels);
            if best.as_ref().is_none_or(|(b, _)| k < *b) {
                best = Some((k, labels));
            }
        }
    }
    best.map(|(_, l)| l).unwrap_or_default()
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
        .map(|&id| {
            assignment.device_of[id.index()]
                .ok_or_else(|| PartitionError::Unassigned(graph.node(id).name.clone()))
        })
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
pub fn partition(
    graph: &Graph,
    assignment: &Assignment,
    options: PartitionOptions,
) -> Result<Partition, PartitionError> {
    let dag = op_dag(graph, assignment)?;
    let labels = select(&dag, options);
    let p = assemble(graph, &assignment.devices, &dag, &labels);
    validate(graph, assignment, &p)?;
    Ok(p)
}

/// Builds subgraphs from per-op labels: numbers them topologically and
/// attaches housekeeping nodes and boundary tensors.
pub fn assemble(graph: &Graph, devices: &[DeviceId], dag: &OpDag, labels: &[u32]) -> Partition {
    let (group, k) = dense_groups(labels);
    let id_of = number_groups(dag, &group, k);
    let (mut subgraphs, subgraph_of) = fill_subgraphs(graph, dag, &group, &id_of);
    let mut is_output = vec![false; graph.tensors.len()];
    attach_inputs(graph, &mut subgraphs, &subgraph_of, &mut is_output);
    let passthrough_outputs = attach_results(graph, &mut subgraphs, &subgraph_of, &mut is_output);
    Partition {
        devices: devices.to_vec(),
        subgraphs,
        subgraph_of,
        passthrough_outputs,
    }
}

/// Each op's group: its label made dense, in order of first appearance;
/// and the number of groups.
fn dense_groups(labels: &[u32]) -> (Vec<usize>, usize) {
    let max_label = labels.iter().map(|&l| l as usize + 1).max().unwrap_or(0);
    let mut dense = vec![usize::MAX; max_label];
    let mut group = Vec::with_capacity(labels.len());
    let mut k = 0;
    for &l in labels {
        if dense[l as usize] == usize::MAX {
            dense[l as usize] = k;
            k += 1;
        }
        group.push(dense[l as usize]);
    }
    (group, k)
}

/// Each group's subgraph id: a topological order of the groups (Kahn;
/// lowest first-appearance first).
fn number_groups(dag: &OpDag, group: &[usize], k: usize) -> Vec<usize> {
    let pairs: Vec<(u32, u32)> = (0..dag.len() as u32)
        .flat_map(|v| dag.succs(v).iter().map(move |&s| (v, s)))
        .map(|(v, s)| (group[v as usize] as u32, group[s as usize] as u32))
        .filter(|(a, b)| a != b)
        .collect();
    let (off, cols) = dag::csr(k, pairs.iter().copied(), pairs.len());
    let succ = |g: usize| &cols[off[g] as usize..off[g + 1] as usize];
    let mut indeg = vec![0usize; k];
    for &b in &cols {
        indeg[b as usize] += 1;
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> = (0..k)
        .filter(|&g| indeg[g] == 0)
        .map(std::cmp::Reverse)
        .collect();
    let mut id_of = vec![usize::MAX; k];
    let mut next_id = 0;
    while let Some(std::cmp::Reverse(g)) = ready.pop() {
        id_of[g] = next_id;
        next_id += 1;
        for &s in succ(g) {
            let s = s as usize;
            indeg[s] -= 1;
            if indeg[s] == 0 {
                ready.push(std::cmp::Reverse(s));
            }
        }
    }
    // A cycle would leave groups unnumbered; number them anyway so that the
    // validator reports it instead of losing nodes.
    for id in id_of.iter_mut().filter(|id| **id == usize::MAX) {
        *id = next_id;
        next_id += 1;
    }
    id_of
}

/// The subgraphs with their op nodes and devices, and each node's
/// subgraph.
fn fill_subgraphs(
    graph: &Graph,
    dag: &OpDag,
    group: &[usize],
    id_of: &[usize],
) -> (Vec<Subgraph>, Vec<Option<usize>>) {
    let k = id_of.len();
    let mut sizes = vec![0usize; k];
    for &g in group {
        sizes[id_of[g]] += 1;
    }
    let mut subgraphs: Vec<Subgraph> = (0..k)
        .map(|id| Subgraph {
            id,
            device: 0,
            nodes: Vec::with_capacity(sizes[id]),
            parameters: Vec::new(),
            constants: Vec::new(),
            results: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
        })
        .collect();
    let mut subgraph_of = vec![None; graph.dag.node_count()];
    for (i, &node) in graph.topo_ops().iter().enumerate() {
        let id = id_of[group[i]];
        subgraph_of[node.index()] = Some(id);
        subgraphs[id].device = dag.device[i];
        subgraphs[id].nodes.push(node);
    }
    (subgraphs, subgraph_of)
}

/// Each subgraph's inputs (tensors of other subgraphs and graph inputs,
/// with their Parameter nodes), the Constant nodes it reads, and the
/// outputs other subgraphs read from it (marked in `is_output`).
fn attach_inputs(
    graph: &Graph,
    subgraphs: &mut [Subgraph],
    subgraph_of: &[Option<usize>],
    is_output: &mut [bool],
) {
    // Where each tensor comes from, in one flat array.
    let source: Vec<Source> = graph
        .tensors
        .iter()
        .map(|t| match graph.node(t.producer).kind {
            NodeKind::Op => Source::Subgraph(subgraph_of[t.producer.index()].unwrap_or(0) as u32),
            NodeKind::Parameter => Source::Parameter,
            NodeKind::Constant => Source::Constant,
            NodeKind::Result => Source::Constant,
        })
        .collect();
    let mut outputs_of: Vec<(u32, TensorId)> = Vec::new();
    // Lists keep first-use order; stamps (subgraph id + 1) dedupe them.
    let mut input_stamp = vec![0u32; graph.tensors.len()];
    let mut node_stamp = vec![0u32; graph.dag.node_count()];
    for (id, sg) in subgraphs.iter_mut().enumerate() {
        let stamp = id as u32 + 1;
        for &n in &sg.nodes {
            let node = graph.node(n);
            for &t in node.inputs.iter().flatten().chain(&node.implicit_inputs) {
                match source[t.index()] {
                    Source::Subgraph(from) if from as usize != id => {
                        if input_stamp[t.index()] != stamp {
                            input_stamp[t.index()] = stamp;
                            sg.inputs.push(t);
                            if !is_output[t.index()] {
                                is_output[t.index()] = true;
                                outputs_of.push((from, t));
                            }
                        }
                    }
                    Source::Subgraph(_) => {}
                    kind => {
                        let producer = graph.tensor(t).producer;
                        if node_stamp[producer.index()] != stamp {
                            node_stamp[producer.index()] = stamp;
                            if kind == Source::Parameter {
                                sg.parameters.push(producer);
                                input_stamp[t.index()] = stamp;
                                sg.inputs.push(t);
                            } else {
                                sg.constants.push(producer);
                            }
                        }
                    }
                }
            }
        }
    }
    for (from, t) in outputs_of {
        subgraphs[from as usize].outputs.push(t);
    }
}

/// Each graph output's Result node goes to the subgraph that makes it
/// (which then outputs it); graph inputs and constants that are outputs
/// as they are pass through, returned.
fn attach_results(
    graph: &Graph,
    subgraphs: &mut [Subgraph],
    subgraph_of: &[Option<usize>],
    is_output: &mut [bool],
) -> Vec<TensorId> {
    let mut passthrough_outputs = Vec::new();
    for &result in graph.result_nodes() {
        let Some(t) = graph.node(result).inputs.first().copied().flatten() else {
            continue;
        };
        let producer = graph.tensor(t).producer;
        match subgraph_of[producer.index()] {
            Some(id) => {
                subgraphs[id].results.push(result);
                if !is_output[t.index()] {
                    is_output[t.index()] = true;
                    subgraphs[id].outputs.push(t);
                }
            }
            None if !passthrough_outputs.contains(&t) => passthrough_outputs.push(t),
            None => {}
        }
    }
    passthrough_outputs
}

/// Where a tensor comes from (see [`assemble`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Subgraph(u32),
    Parameter,
    Constant,
}
