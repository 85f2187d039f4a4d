//! What running a set of nodes on a device needs in memory.
//!
//! - **Weights**: the initializers (and `Constant` nodes) the nodes read,
//!   each counted once per device however many of its nodes or subgraphs
//!   read it.
//! - **Activations**: the most bytes of intermediate tensors alive at once
//!   while a subgraph runs, at the largest batch (its inputs until their
//!   last reader, each node's outputs from that node until their last
//!   reader, the subgraph's outputs until it ends). A device running
//!   several subgraphs holds each one's peak (they run concurrently in a
//!   pipeline).
//! - **State**: per-sequence state declared for nodes (a decoder's KV
//!   cache: most sequences × longest context), kept between requests.
//!
//! Dims unknown when the model is planned count as 1, except a dynamic
//! first (batch) dim, which counts as the largest batch; a tensor of
//! unknown rank counts as [`DEFAULT_NUMEL`] elements. Fixing dynamic dims
//! (`--shape`) makes the figure exact.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::affinity::{DeviceIdx, DEFAULT_ELEM_BYTES, DEFAULT_NUMEL};
use crate::graph::{Dim, Graph, NodeId, NodeKind, TensorId};
use crate::partition::Partition;

/// Bytes a device needs for what runs on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemoryNeed {
    pub weights: u64,
    pub activations: u64,
    pub state: u64,
}

impl MemoryNeed {
    pub fn total(&self) -> u64 {
        self.weights
            .saturating_add(self.activations)
            .saturating_add(self.state)
    }
}

impl std::ops::AddAssign for MemoryNeed {
    fn add_assign(&mut self, o: MemoryNeed) {
        self.weights = self.weights.saturating_add(o.weights);
        self.activations = self.activations.saturating_add(o.activations);
        self.state = self.state.saturating_add(o.state);
    }
}

impl std::fmt::Display for MemoryNeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use super::format_size as s;
        write!(
            f,
            "{} (weights {}, activations {}",
            s(self.total()),
            s(self.weights),
            s(self.activations)
        )?;
        if self.state > 0 {
            write!(f, ", state {}", s(self.state))?;
        }
        f.write_str(")")
    }
}

/// The need model of one graph at one batch size.
pub struct NeedModel<'g> {
    graph: &'g Graph,
    batch: u64,
    /// Declared per-sequence state of op nodes, bytes.
    state: HashMap<NodeId, u64>,
}

impl<'g> NeedModel<'g> {
    /// `batch`: the largest batch a request may carry (1 without dynamic
    /// batching); `state`: node name → bytes of per-sequence state it
    /// keeps (names the graph lacks are ignored).
    pub fn new(graph: &'g Graph, batch: u64, state: &BTreeMap<String, u64>) -> NeedModel<'g> {
        let state = state
            .iter()
            .filter_map(|(name, &bytes)| Some((graph.op_by_name(name)?, bytes)))
            .collect();
        NeedModel {
            graph,
            batch: batch.max(1),
            state,
        }
    }

    pub fn graph(&self) -> &'g Graph {
        self.graph
    }

    /// Bytes of a tensor while a request runs (see the module doc).
    pub fn tensor_bytes(&self, t: TensorId) -> u64 {
        let t = self.graph.tensor(t);
        let elem = t
            .elem_type
            .and_then(|e| e.size_bytes())
            .unwrap_or(DEFAULT_ELEM_BYTES);
        let Some(shape) = &t.shape else {
            return DEFAULT_NUMEL * elem;
        };
        shape
            .iter()
            .enumerate()
            .map(|(i, d)| match d {
                Dim::Known(v) => u64::try_from(*v).unwrap_or(0),
                _ if i == 0 => self.batch,
                _ => 1,
            })
            .fold(elem, u64::saturating_mul)
    }

    /// The weights `node` reads: (the Constant node, its bytes).
    pub fn weights_read(&self, node: NodeId) -> impl Iterator<Item = (NodeId, u64)> + '_ {
        self.graph.node(node).all_inputs().filter_map(move |t| {
            let tensor = self.graph.tensor(t);
            (self.graph.node(tensor.producer).kind == NodeKind::Constant)
                .then(|| (tensor.producer, tensor.size_bytes().unwrap_or(0)))
        })
    }

    /// Declared state of `node`, bytes.
    pub fn state_of(&self, node: NodeId) -> u64 {
        self.state.get(&node).copied().unwrap_or(0)
    }

    /// Whether `t` is an activation (not a weight).
    fn is_activation(&self, t: TensorId) -> bool {
        self.graph.node(self.graph.tensor(t).producer).kind != NodeKind::Constant
    }

    /// The need of running `ops` (in topological order) as one subgraph
    /// whose `outputs` leave it.
    pub fn subgraph_need(&self, ops: &[NodeId], outputs: &[TensorId]) -> MemoryNeed {
        let mut weights = HashSet::new();
        let mut need = MemoryNeed::default();
        for &op in ops {
            for (c, bytes) in self.weights_read(op) {
                if weights.insert(c) {
                    need.weights += bytes;
                }
            }
            need.state += self.state_of(op);
        }
        need.activations = self.peak_activations(ops, outputs);
        need
    }

    /// The most activation bytes alive at once while `ops` run in order.
    fn peak_activations(&self, ops: &[NodeId], outputs: &[TensorId]) -> u64 {
        if ops.is_empty() {
            return 0;
        }
        let last = ops.len() - 1;
        // Each tensor's span of positions: from its producer (0 for one
        // that enters) to its last reader here (the end for one leaving).
        let mut span: HashMap<TensorId, (usize, usize)> = HashMap::new();
        for (i, &op) in ops.iter().enumerate() {
            let node = self.graph.node(op);
            for t in node.all_inputs().filter(|&t| self.is_activation(t)) {
                span.entry(t).or_insert((0, i)).1 = i;
            }
            for &t in node.outputs.iter().flatten() {
                span.insert(t, (i, i));
            }
        }
        for t in outputs {
            if let Some(s) = span.get_mut(t) {
                s.1 = last;
            }
        }
        let mut delta = vec![0i128; ops.len() + 1];
        for (&t, &(from, to)) in &span {
            let b = i128::from(self.tensor_bytes(t));
            delta[from] += b;
            delta[to + 1] -= b;
        }
        let mut live = 0i128;
        let mut peak = 0i128;
        for d in &delta[..ops.len()] {
            live += d;
            peak = peak.max(live);
        }
        u64::try_from(peak).unwrap_or(u64::MAX)
    }

    /// Each device's need under `partition` (devices with no subgraph are
    /// left out): weights counted once per device, every subgraph's peak
    /// activations and state added.
    pub fn device_needs(&self, partition: &Partition) -> BTreeMap<DeviceIdx, MemoryNeed> {
        let mut seen: HashMap<DeviceIdx, HashSet<NodeId>> = HashMap::new();
        let mut out: BTreeMap<DeviceIdx, MemoryNeed> = BTreeMap::new();
        for sg in &partition.subgraphs {
            let need = out.entry(sg.device).or_default();
            let weights = seen.entry(sg.device).or_default();
            for &op in &sg.nodes {
                for (c, bytes) in self.weights_read(op) {
                    if weights.insert(c) {
                        need.weights += bytes;
                    }
                }
                need.state += self.state_of(op);
            }
            need.activations += self.peak_activations(&sg.nodes, &sg.outputs);
        }
        out
    }
}
