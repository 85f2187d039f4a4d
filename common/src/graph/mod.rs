//! The graph IR: one petgraph node per ONNX node plus housekeeping nodes for
//! graph inputs ([`NodeKind::Parameter`]), initializers ([`NodeKind::Constant`])
//! and graph outputs ([`NodeKind::Result`]). Every edge is one tensor flowing
//! from its producer to one consumer and carries the tensor's id, through which
//! its name, element type and static shape (where known) are reached.
//!
//! Subgraph-bearing ops (If, Loop, Scan) are single opaque nodes; the outer
//! tensors their bodies capture become *implicit* input edges so that the
//! partitioner sees every real dependency.

mod build;
mod collections;
pub(crate) mod infer;
mod layers;
mod state;

pub use collections::{OPTIONAL_OP, SEQUENCE_OPS};

pub use layers::LAYER_PREFIX_KEY;
pub use state::{StateError, StatePair, PADDING_KEY, STATE_PAIRS_KEY};

use std::collections::HashMap;

use petgraph::graph::DiGraph;

use crate::onnx::proto::ModelProto;
use crate::onnx::ElemType;

pub(crate) use build::free_names;
pub use build::GraphError;

/// Index of a node in [`Graph::dag`].
pub type NodeId = petgraph::graph::NodeIndex<u32>;

/// Index of a tensor in [`Graph::tensors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl TensorId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What a node of the IR stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// A real ONNX node (an operator application).
    Op,
    /// A graph input (not an initializer).
    Parameter,
    /// An initializer, or an input-less ONNX `Constant` node (then
    /// `onnx_index` is set).
    Constant,
    /// A graph output.
    Result,
}

impl NodeKind {
    pub fn is_housekeeping(self) -> bool {
        self != NodeKind::Op
    }
}

/// One node of the IR.
#[derive(Debug, Clone)]
pub struct Node {
    /// For ops: the (unique, possibly generated) ONNX node name. For
    /// housekeeping nodes: the tensor's name.
    pub name: String,
    pub kind: NodeKind,
    /// The ONNX op type; `Parameter`, `Constant` or `Result` for housekeeping.
    pub op_type: String,
    /// The op's domain; empty for the default `ai.onnx` domain.
    pub domain: String,
    /// Position of the node in the model's `graph.node` (ops only).
    pub onnx_index: Option<usize>,
    /// Explicit inputs in ONNX order; `None` for an omitted optional input.
    pub inputs: Vec<Option<TensorId>>,
    /// Outer-scope tensors captured by the node's subgraph attributes.
    pub implicit_inputs: Vec<TensorId>,
    /// Outputs in ONNX order; `None` for an omitted optional output.
    pub outputs: Vec<Option<TensorId>>,
    /// The node carries graph attributes (If / Loop / Scan bodies).
    pub has_subgraphs: bool,
}

impl Node {
    /// Every input tensor, explicit and implicit, without duplicates.
    pub fn all_inputs(&self) -> impl Iterator<Item = TensorId> + '_ {
        let mut seen = Vec::<TensorId>::new();
        self.inputs
            .iter()
            .flatten()
            .chain(self.implicit_inputs.iter())
            .copied()
            .filter(move |t| {
                if seen.contains(t) {
                    false
                } else {
                    seen.push(*t);
                    true
                }
            })
    }
}

/// One dimension of a static shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Dim {
    Known(i64),
    /// A named symbolic dimension (`dim_param`).
    Sym(String),
    Unknown,
}

impl Dim {
    pub fn known(&self) -> Option<i64> {
        match self {
            Dim::Known(v) => Some(*v),
            _ => None,
        }
    }
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Known(v) => write!(f, "{v}"),
            Dim::Sym(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// Element count of a fully static shape.
pub fn numel(shape: &[Dim]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, d| {
        acc.checked_mul(u64::try_from(d.known()?).ok()?)
    })
}

/// `float[1,3,?,w]`: an element type and shape, `?` and `[..]` where
/// unknown.
pub fn type_string(elem: Option<ElemType>, shape: Option<&[Dim]>) -> String {
    let ty = elem.map(|t| t.to_string()).unwrap_or_else(|| "?".into());
    match shape {
        Some(dims) => {
            let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
            format!("{ty}[{}]", dims.join(","))
        }
        None => format!("{ty}[..]"),
    }
}

/// A tensor: one producer, any number of consumers.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: String,
    pub elem_type: Option<ElemType>,
    /// `None`: rank unknown.
    pub shape: Option<Vec<Dim>>,
    pub producer: NodeId,
    /// Consuming nodes (ops and Result nodes), each listed once.
    pub consumers: Vec<NodeId>,
}

impl Tensor {
    /// Size in bytes where type and shape are fully known.
    pub fn size_bytes(&self) -> Option<u64> {
        numel(self.shape.as_deref()?)?.checked_mul(self.elem_type?.size_bytes()?)
    }

    /// `float[1,3,?,w]`-style summary.
    pub fn type_string(&self) -> String {
        type_string(self.elem_type, self.shape.as_deref())
    }
}

/// An edge: `tensor` flows from the source node to the target node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    pub tensor: TensorId,
    /// The target captures the tensor inside a subgraph attribute.
    pub implicit: bool,
}

/// The IR of one ONNX model. Built with [`Graph::from_model`].
#[derive(Debug, Clone)]
pub struct Graph {
    /// The model, with every node given a unique name.
    model: ModelProto,
    /// Nodes and tensor edges.
    pub dag: DiGraph<Node, Edge, u32>,
    /// All tensors, indexed by [`TensorId`].
    pub tensors: Vec<Tensor>,
    tensor_by_name: HashMap<String, TensorId>,
    op_by_name: HashMap<String, NodeId>,
    onnx_by_name: HashMap<String, NodeId>,
    /// Op nodes in a topological order (the model's order where it is one).
    topo_ops: Vec<NodeId>,
    /// Graph inputs that are not initializers, in model order.
    pub inputs: Vec<TensorId>,
    /// Graph outputs, in model order.
    pub outputs: Vec<TensorId>,
    /// The Result node of each graph output, in model order.
    result_nodes: Vec<NodeId>,
}

impl Graph {
    /// The model with normalized node names (what gets exported).
    pub fn model(&self) -> &ModelProto {
        &self.model
    }

    /// The model's name (graph name, else "model").
    pub fn model_name(&self) -> &str {
        self.model
            .graph
            .as_ref()
            .and_then(|g| g.name.as_deref())
            .filter(|n| !n.is_empty())
            .unwrap_or("model")
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.dag[id]
    }

    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }

    /// The op node with this ONNX name.
    pub fn op_by_name(&self, name: &str) -> Option<NodeId> {
        self.op_by_name.get(name).copied()
    }

    /// The node made from the ONNX node with this name (an op, or a
    /// `Constant` node, which is housekeeping).
    pub fn onnx_node_by_name(&self, name: &str) -> Option<NodeId> {
        self.onnx_by_name.get(name).copied()
    }

    /// Number of nodes made from ONNX nodes (ops and `Constant` nodes).
    pub fn onnx_node_count(&self) -> usize {
        self.onnx_by_name.len()
    }

    /// The tensor with this name.
    pub fn tensor_by_name(&self, name: &str) -> Option<TensorId> {
        self.tensor_by_name.get(name).copied()
    }

    /// Result nodes (one per graph output), in model order.
    pub fn result_nodes(&self) -> &[NodeId] {
        &self.result_nodes
    }

    /// Op nodes in topological order.
    pub fn topo_ops(&self) -> &[NodeId] {
        &self.topo_ops
    }

    /// Number of op nodes.
    pub fn op_count(&self) -> usize {
        self.topo_ops.len()
    }

    /// Op nodes whose op type is `op_type`.
    pub fn ops_of_type<'a>(&'a self, op_type: &'a str) -> impl Iterator<Item = NodeId> + 'a {
        self.topo_ops
            .iter()
            .copied()
            .filter(move |&n| self.dag[n].op_type == op_type)
    }
}
