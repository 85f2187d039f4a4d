//! Building the IR from a `ModelProto`: unique node names, tensors, edges,
//! implicit captures of subgraph bodies and a topological order.

use std::collections::{BinaryHeap, HashMap, HashSet};

use petgraph::graph::DiGraph;
use petgraph::Direction;

use super::{infer, Dim, Edge, Graph, Node, NodeId, NodeKind, Tensor, TensorId};
use crate::onnx::proto::{type_proto, GraphProto, ModelProto, NodeProto, TypeProto};
use crate::onnx::ElemType;

/// Why a model cannot be turned into a graph.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("the model has no graph")]
    NoGraph,
    #[error("tensor '{tensor}' is produced twice (by '{first}' and by '{second}')")]
    DuplicateProducer {
        tensor: String,
        first: String,
        second: String,
    },
    #[error(
        "node '{node}' reads tensor '{tensor}', which no node, graph input or initializer produces"
    )]
    UndefinedInput { node: String, tensor: String },
    #[error("graph output '{0}' is not produced by any node, graph input or initializer")]
    UndefinedOutput(String),
    #[error("the graph is not acyclic: node '{0}' is on a cycle")]
    Cycle(String),
}

/// Gives every node a unique, stable name: existing unique names are kept;
/// empty or repeated names become `<OpType>_<index>` (with a suffix if that
/// is taken too).
pub fn normalize_node_names(graph: &mut GraphProto) {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for n in &graph.node {
        *count.entry(n.name.as_deref().unwrap_or("")).or_default() += 1;
    }
    let mut taken: HashSet<String> = count
        .iter()
        .filter(|(name, _)| !name.is_empty())
        .map(|(name, _)| name.to_string())
        .collect();
    let mut first_seen: HashSet<String> = HashSet::new();
    let duplicated: HashSet<String> = count
        .iter()
        .filter(|(name, c)| **c > 1 && !name.is_empty())
        .map(|(name, _)| name.to_string())
        .collect();
    for (i, node) in graph.node.iter_mut().enumerate() {
        let name = node.name.clone().unwrap_or_default();
        let keep =
            !name.is_empty() && (!duplicated.contains(&name) || first_seen.insert(name.clone()));
        if keep {
            continue;
        }
        let base = if name.is_empty() {
            format!("{}_{i}", node.op_type.as_deref().unwrap_or("node"))
        } else {
            format!("{name}_{i}")
        };
        let mut candidate = base.clone();
        let mut k = 1;
        while taken.contains(&candidate) {
            candidate = format!("{base}_{k}");
            k += 1;
        }
        taken.insert(candidate.clone());
        node.name = Some(candidate);
    }
}

/// Element type and shape from a `TypeProto` (tensor types only).
pub(crate) fn tensor_type(tp: &TypeProto) -> (Option<ElemType>, Option<Vec<Dim>>) {
    let Some(type_proto::Value::TensorType(t)) = &tp.value else {
        return (None, None);
    };
    let elem = t.elem_type.filter(|&e| e != 0).map(ElemType);
    let shape = t.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                // Some exporters write -1 for a dynamic dimension.
                Some(crate::onnx::proto::tensor_shape_proto::dimension::Value::DimValue(v))
                    if *v >= 0 =>
                {
                    Dim::Known(*v)
                }
                Some(crate::onnx::proto::tensor_shape_proto::dimension::Value::DimParam(p)) => {
                    Dim::Sym(p.clone())
                }
                _ => Dim::Unknown,
            })
            .collect()
    });
    (elem, shape)
}

/// Names read by `graph`'s nodes (recursively) that `graph` does not define.
pub(crate) fn free_names(graph: &GraphProto) -> Vec<String> {
    let mut defined: HashSet<&str> = HashSet::new();
    defined.extend(graph.input.iter().filter_map(|v| v.name.as_deref()));
    defined.extend(graph.initializer.iter().filter_map(|t| t.name.as_deref()));
    defined.extend(
        graph
            .sparse_initializer
            .iter()
            .filter_map(|s| s.values.as_ref()?.name.as_deref()),
    );
    for n in &graph.node {
        defined.extend(n.output.iter().map(String::as_str));
    }
    let mut free = Vec::new();
    let mut seen = HashSet::new();
    for n in &graph.node {
        let nested = node_subgraph_free_names(n);
        for name in n.input.iter().cloned().chain(nested) {
            if !name.is_empty() && !defined.contains(name.as_str()) && seen.insert(name.clone()) {
                free.push(name);
            }
        }
    }
    free
}

fn node_subgraph_free_names(node: &NodeProto) -> Vec<String> {
    node.attribute
        .iter()
        .flat_map(|a| a.g.iter().chain(a.graphs.iter()))
        .flat_map(free_names)
        .collect()
}

impl Graph {
    /// Builds the IR. Unnamed or duplicate-named nodes get generated names,
    /// which are written back into the model that [`Graph::model`] returns.
    pub fn from_model(mut model: ModelProto) -> Result<Graph, GraphError> {
        let g = model.graph.as_mut().ok_or(GraphError::NoGraph)?;
        normalize_node_names(g);
        let g = model.graph.as_ref().ok_or(GraphError::NoGraph)?;

        let mut types: HashMap<&str, &TypeProto> = HashMap::new();
        for v in g.value_info.iter().chain(&g.input).chain(&g.output) {
            if let (Some(name), Some(tp)) = (v.name.as_deref(), v.r#type.as_ref()) {
                types.insert(name, tp);
            }
        }
        let mut b = Builder {
            dag: DiGraph::with_capacity(g.node.len() + g.input.len(), g.node.len() * 2),
            tensors: Vec::new(),
            by_name: HashMap::new(),
            types,
        };
        b.add_initializers(g)?;
        let inputs = b.add_inputs(g)?;
        let (op_by_name, onnx_by_name) = b.add_nodes(g)?;
        b.connect_nodes(g)?;
        let (outputs, result_nodes) = b.add_results(g)?;

        let topo_ops = topological_ops(&b.dag)?;
        let mut graph = Graph {
            dag: b.dag,
            tensors: b.tensors,
            tensor_by_name: b.by_name,
            op_by_name,
            onnx_by_name,
            topo_ops,
            inputs,
            outputs,
            result_nodes,
            model: ModelProto::default(),
        };
        infer::propagate(&mut graph, &model);
        graph.model = model;
        Ok(graph)
    }
}

/// Node ids by ONNX node name: the op nodes, and every node made from an
/// ONNX node (`Constant` nodes too).
type NamedNodes = (HashMap<String, NodeId>, HashMap<String, NodeId>);

impl Builder<'_> {
    /// Initializers (dense and sparse) as Constant nodes.
    fn add_initializers(&mut self, g: &GraphProto) -> Result<(), GraphError> {
        for init in &g.initializer {
            let name = init.name.clone().unwrap_or_default();
            let id = self.housekeeping(NodeKind::Constant, &name)?;
            let t = &mut self.tensors[id.index()];
            t.elem_type = init.data_type.filter(|&d| d != 0).map(ElemType);
            t.shape = Some(init.dims.iter().map(|&d| Dim::Known(d)).collect());
        }
        for sparse in &g.sparse_initializer {
            let values = sparse.values.as_ref();
            let name = values.and_then(|v| v.name.clone()).unwrap_or_default();
            let id = self.housekeeping(NodeKind::Constant, &name)?;
            let t = &mut self.tensors[id.index()];
            t.elem_type = values
                .and_then(|v| v.data_type)
                .filter(|&d| d != 0)
                .map(ElemType);
            t.shape = Some(sparse.dims.iter().map(|&d| Dim::Known(d)).collect());
        }
        Ok(())
    }

    /// Graph inputs that are not initializers, as Parameter nodes; their
    /// tensors in order.
    fn add_inputs(&mut self, g: &GraphProto) -> Result<Vec<TensorId>, GraphError> {
        for input in &g.input {
            let name = input.name.as_deref().unwrap_or("");
            if !self.by_name.contains_key(name) {
                self.housekeeping(NodeKind::Parameter, name)?;
            }
        }
        Ok(g.input
            .iter()
            .filter_map(|v| self.by_name.get(v.name.as_deref().unwrap_or("")).copied())
            .filter(|&t| self.dag[self.tensors[t.index()].producer].kind == NodeKind::Parameter)
            .collect())
    }

    /// One node per ONNX node with its outputs (the model need not be
    /// sorted: edges come after, in [`Builder::connect_nodes`]).
    fn add_nodes(&mut self, g: &GraphProto) -> Result<NamedNodes, GraphError> {
        let mut op_by_name = HashMap::with_capacity(g.node.len());
        let mut onnx_by_name = HashMap::with_capacity(g.node.len());
        for (i, n) in g.node.iter().enumerate() {
            let name = n.name.clone().unwrap_or_default();
            // An input-less `Constant` node is data, like an initializer: it
            // becomes a housekeeping Constant that follows its consumers.
            let is_constant = n.op_type.as_deref() == Some("Constant")
                && matches!(n.domain.as_deref(), None | Some("") | Some("ai.onnx"))
                && n.input.iter().all(String::is_empty);
            let id = self.dag.add_node(Node {
                name: name.clone(),
                kind: if is_constant {
                    NodeKind::Constant
                } else {
                    NodeKind::Op
                },
                op_type: n.op_type.clone().unwrap_or_default(),
                domain: n.domain.clone().unwrap_or_default(),
                onnx_index: Some(i),
                inputs: Vec::new(),
                implicit_inputs: Vec::new(),
                outputs: Vec::new(),
                has_subgraphs: n
                    .attribute
                    .iter()
                    .any(|a| a.g.is_some() || !a.graphs.is_empty()),
            });
            if !is_constant {
                op_by_name.insert(name.clone(), id);
            }
            onnx_by_name.insert(name, id);
            let mut outputs = Vec::with_capacity(n.output.len());
            for out in &n.output {
                outputs.push(if out.is_empty() {
                    None
                } else {
                    Some(self.define(out, id)?)
                });
            }
            self.dag[id].outputs = outputs;
        }
        Ok((op_by_name, onnx_by_name))
    }

    /// Each ONNX node's inputs and edges: explicit inputs, and the names
    /// its subgraphs (If/Loop/Scan bodies) read from outside as implicit
    /// inputs. The nodes of `g` are the last ones added.
    fn connect_nodes(&mut self, g: &GraphProto) -> Result<(), GraphError> {
        for (i, n) in g.node.iter().enumerate() {
            let id = NodeId::new(self.dag.node_count() - g.node.len() + i);
            let mut inputs = Vec::with_capacity(n.input.len());
            for name in &n.input {
                inputs.push(if name.is_empty() {
                    None
                } else {
                    Some(self.resolve(name, id)?)
                });
            }
            let mut implicit = Vec::new();
            if self.dag[id].has_subgraphs {
                for name in node_subgraph_free_names(n) {
                    let t = self.resolve(&name, id)?;
                    if !inputs.contains(&Some(t)) && !implicit.contains(&t) {
                        implicit.push(t);
                    }
                }
            }
            self.dag[id].inputs = inputs;
            self.dag[id].implicit_inputs = implicit;
            self.connect(id);
        }
        Ok(())
    }

    /// A Result node per graph output; the output tensors and the Result
    /// nodes, in order.
    fn add_results(&mut self, g: &GraphProto) -> Result<(Vec<TensorId>, Vec<NodeId>), GraphError> {
        let mut outputs = Vec::with_capacity(g.output.len());
        let mut result_nodes = Vec::with_capacity(g.output.len());
        for out in &g.output {
            let name = out.name.as_deref().unwrap_or("");
            let t = *self
                .by_name
                .get(name)
                .ok_or_else(|| GraphError::UndefinedOutput(name.to_string()))?;
            let id = self.dag.add_node(Node {
                name: name.to_string(),
                kind: NodeKind::Result,
                op_type: "Result".into(),
                domain: String::new(),
                onnx_index: None,
                inputs: vec![Some(t)],
                implicit_inputs: Vec::new(),
                outputs: Vec::new(),
                has_subgraphs: false,
            });
            self.connect(id);
            outputs.push(t);
            result_nodes.push(id);
        }
        Ok((outputs, result_nodes))
    }
}

struct Builder<'m> {
    dag: DiGraph<Node, Edge, u32>,
    tensors: Vec<Tensor>,
    by_name: HashMap<String, TensorId>,
    types: HashMap<&'m str, &'m TypeProto>,
}

impl Builder<'_> {
    fn housekeeping(&mut self, kind: NodeKind, name: &str) -> Result<TensorId, GraphError> {
        let id = self.dag.add_node(Node {
            name: name.to_string(),
            kind,
            op_type: format!("{kind:?}"),
            domain: String::new(),
            onnx_index: None,
            inputs: Vec::new(),
            implicit_inputs: Vec::new(),
            outputs: Vec::new(),
            has_subgraphs: false,
        });
        let t = self.define(name, id)?;
        self.dag[id].outputs = vec![Some(t)];
        Ok(t)
    }

    fn define(&mut self, name: &str, producer: NodeId) -> Result<TensorId, GraphError> {
        if let Some(&existing) = self.by_name.get(name) {
            let first = self.dag[self.tensors[existing.index()].producer]
                .name
                .clone();
            return Err(GraphError::DuplicateProducer {
                tensor: name.to_string(),
                first,
                second: self.dag[producer].name.clone(),
            });
        }
        let (elem_type, shape) = self
            .types
            .get(name)
            .map(|tp| tensor_type(tp))
            .unwrap_or_default();
        let id = TensorId(self.tensors.len() as u32);
        self.tensors.push(Tensor {
            name: name.to_string(),
            elem_type,
            shape,
            producer,
            consumers: Vec::new(),
        });
        self.by_name.insert(name.to_string(), id);
        Ok(id)
    }

    fn resolve(&self, name: &str, node: NodeId) -> Result<TensorId, GraphError> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| GraphError::UndefinedInput {
                node: self.dag[node].name.clone(),
                tensor: name.to_string(),
            })
    }

    /// Adds one edge per distinct input tensor of `node`.
    fn connect(&mut self, node: NodeId) {
        let explicit: Vec<TensorId> = self.dag[node].inputs.iter().flatten().copied().collect();
        let implicit = self.dag[node].implicit_inputs.clone();
        let mut seen = Vec::new();
        for (t, is_implicit) in explicit
            .into_iter()
            .map(|t| (t, false))
            .chain(implicit.into_iter().map(|t| (t, true)))
        {
            if seen.contains(&t) {
                continue;
            }
            seen.push(t);
            let tensor = &mut self.tensors[t.index()];
            tensor.consumers.push(node);
            let producer = tensor.producer;
            self.dag.add_edge(
                producer,
                node,
                Edge {
                    tensor: t,
                    implicit: is_implicit,
                },
            );
        }
    }
}

/// Kahn's algorithm, taking the lowest node index first so that a model that
/// is already sorted keeps its order.
fn topological_ops(dag: &DiGraph<Node, Edge, u32>) -> Result<Vec<NodeId>, GraphError> {
    let n = dag.node_count();
    let mut indegree: Vec<u32> = vec![0; n];
    for e in dag.raw_edges() {
        indegree[e.target().index()] += 1;
    }
    let mut ready: BinaryHeap<std::cmp::Reverse<u32>> = indegree
        .iter()
        .enumerate()
        .filter(|(_, &d)| d == 0)
        .map(|(i, _)| std::cmp::Reverse(i as u32))
        .collect();
    let mut ops = Vec::with_capacity(n);
    let mut visited = 0usize;
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        visited += 1;
        let id = NodeId::new(i as usize);
        if dag[id].kind == NodeKind::Op {
            ops.push(id);
        }
        for succ in dag.neighbors_directed(id, Direction::Outgoing) {
            let d = &mut indegree[succ.index()];
            *d -= 1;
            if *d == 0 {
                ready.push(std::cmp::Reverse(succ.index() as u32));
            }
        }
    }
    if visited < n {
        let on_cycle = (0..n)
            .find(|&i| indegree[i] > 0)
            .map(|i| dag[NodeId::new(i)].name.clone())
            .unwrap_or_default();
        return Err(GraphError::Cycle(on_cycle));
    }
    Ok(ops)
}
