//! Graph simplification before QueryNetwork and partitioning, as OpenVINO's
//! transformations and onnxruntime's graph optimizers do:
//! - concrete input shapes (`--shape NAME=1,3,640,640`) are written into
//!   the model's inputs; without them dynamic dims stay dynamic;
//! - constant folding: a default-domain node whose inputs are all constant
//!   (initializers, `Constant` nodes, folded outputs) is evaluated and its
//!   outputs become initializers, under a size cap so that weights are not
//!   duplicated;
//! - shape folding: `Shape`/`Size` of a tensor whose static shape is known
//!   become constants, and so do `Gather`/`Slice`/`Concat`/`Unsqueeze`/…
//!   chains over a partly known shape where they select only known dims;
//! - dead nodes (reaching no graph output) and unused initializers go.
//!
//! It repeats until nothing changes: folding a Reshape's target lets shape
//! inference type the Reshape's output, whose `Shape` then folds.
//!
//! Layout: [`value`] holds the constant values; `fold/` the per-op rules,
//! one file per op family with a table from op type to rule.

pub mod fold;
pub mod value;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::graph::{Graph, GraphError, NodeKind, TensorId};
use crate::onnx::proto::{
    tensor_shape_proto::{dimension, Dimension},
    type_proto, ModelProto, NodeProto, TensorShapeProto,
};
use fold::Args;
use value::{Data, Value};

/// Why a model could not be simplified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimplifyError {
    #[error("--shape names '{name}', which is not a graph input; the inputs are: {inputs}")]
    UnknownInput { name: String, inputs: String },
    #[error("--shape {name}={given:?} does not fit the declared shape {declared}")]
    ShapeMismatch {
        name: String,
        given: Vec<usize>,
        declared: String,
    },
    #[error("invalid model: {0}")]
    Graph(String),
}

impl From<GraphError> for SimplifyError {
    fn from(e: GraphError) -> Self {
        SimplifyError::Graph(e.to_string())
    }
}

/// How to simplify.
#[derive(Debug, Clone)]
pub struct SimplifyOptions {
    /// Concrete shapes of graph inputs (by name).
    pub input_shapes: BTreeMap<String, Vec<usize>>,
    /// A folded output larger than this stays an op, unless folding frees
    /// every constant it reads (then nothing is duplicated).
    pub max_folded_bytes: usize,
}

impl Default for SimplifyOptions {
    fn default() -> Self {
        SimplifyOptions {
            input_shapes: BTreeMap::new(),
            max_folded_bytes: 64 << 10,
        }
    }
}

/// Constant inputs larger than this are not read (16 MiB of elements).
const MAX_READ_ELEMS: usize = 16 << 20;
/// Iterations of fold → infer until nothing changes.
const MAX_ROUNDS: usize = 16;

/// One node folded into a constant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoldedNode {
    pub node: String,
    pub op_type: String,
}

/// What simplification did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimplifyReport {
    /// Graph inputs given concrete shapes.
    pub fixed_inputs: Vec<(String, Vec<usize>)>,
    /// Nodes evaluated into constants.
    pub folded: Vec<FoldedNode>,
    /// Nodes removed because no graph output depends on them.
    pub dead: Vec<FoldedNode>,
    /// `Constant` nodes removed with what they fed (not ops: left out of
    /// `dead` and the summary; a manual affinity may still name them).
    #[serde(default)]
    pub dropped_constants: Vec<String>,
}

impl SimplifyReport {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.fixed_inputs.is_empty() && self.folded.is_empty() && self.dead.is_empty()
    }

    /// `folded 12 nodes (Shape 4, Gather 4, …), removed 1 dead node`.
    pub fn summary(&self) -> String {
        let count = |nodes: &[FoldedNode]| {
            let mut by_op: BTreeMap<&str, usize> = BTreeMap::new();
            for n in nodes {
                *by_op.entry(&n.op_type).or_default() += 1;
            }
            let ops: Vec<String> = by_op.iter().map(|(op, n)| format!("{op} {n}")).collect();
            format!("{} nodes ({})", nodes.len(), ops.join(", "))
        };
        let mut parts = Vec::new();
        if !self.fixed_inputs.is_empty() {
            let fixed: Vec<String> = self
                .fixed_inputs
                .iter()
                .map(|(n, s)| format!("{n}={s:?}"))
                .collect();
            parts.push(format!("input shapes {}", fixed.join(" ")));
        }
        if !self.folded.is_empty() {
            parts.push(format!("folded {}", count(&self.folded)));
        }
        if !self.dead.is_empty() {
            parts.push(format!("removed dead {}", count(&self.dead)));
        }
        if parts.is_empty() {
            "nothing to simplify".into()
        } else {
            parts.join("; ")
        }
    }
}

/// Simplifies `model` (see the module doc). The graph inputs and outputs
/// keep their names and order.
pub fn simplify(
    model: &ModelProto,
    options: &SimplifyOptions,
) -> Result<(ModelProto, SimplifyReport), SimplifyError> {
    let mut model = model.clone();
    let mut report = SimplifyReport {
        fixed_inputs: fix_input_shapes(&mut model, &options.input_shapes)?,
        ..Default::default()
    };
    for _ in 0..MAX_ROUNDS {
        let graph = Graph::from_model(model)?;
        let folded = fold_round(&graph, options);
        model = graph.model().clone();
        let changed = !folded.values.is_empty();
        rewrite(&mut model, &graph, &folded, &mut report);
        let (dead, constants) = remove_dead(&mut model);
        let any_dead = !dead.is_empty();
        report.dead.extend(dead);
        report.dropped_constants.extend(constants);
        if !changed && !any_dead {
            break;
        }
    }
    Ok((model, report))
}

/// Writes the given shapes into the model's graph inputs.
fn fix_input_shapes(
    model: &mut ModelProto,
    shapes: &BTreeMap<String, Vec<usize>>,
) -> Result<Vec<(String, Vec<usize>)>, SimplifyError> {
    let Some(g) = model.graph.as_mut() else {
        return Err(SimplifyError::Graph("the model has no graph".into()));
    };
    let inits: HashSet<&str> = g
        .initializer
        .iter()
        .filter_map(|t| t.name.as_deref())
        .collect();
    let names: Vec<String> = g
        .input
        .iter()
        .filter_map(|v| v.name.clone())
        .filter(|n| !inits.contains(n.as_str()))
        .collect();
    let mut fixed = Vec::new();
    for (name, given) in shapes {
        let input = g
            .input
            .iter_mut()
            .find(|v| v.name.as_deref() == Some(name.as_str()))
            .filter(|_| names.contains(name))
            .ok_or_else(|| SimplifyError::UnknownInput {
                name: name.clone(),
                inputs: names.join(", "),
            })?;
        let Some(type_proto::Value::TensorType(t)) =
            input.r#type.as_mut().and_then(|t| t.value.as_mut())
        else {
            return Err(SimplifyError::ShapeMismatch {
                name: name.clone(),
                given: given.clone(),
                declared: "not a tensor".into(),
            });
        };
        if let Some(declared) = &t.shape {
            let fits = declared.dim.len() == given.len()
                && declared.dim.iter().zip(given).all(|(d, &g)| match d.value {
                    Some(dimension::Value::DimValue(v)) if v >= 0 => v as usize == g,
                    _ => true,
                });
            if !fits {
                let dims: Vec<String> = declared
                    .dim
                    .iter()
                    .map(|d| match &d.value {
                        Some(dimension::Value::DimValue(v)) if *v >= 0 => v.to_string(),
                        Some(dimension::Value::DimParam(p)) => p.clone(),
                        _ => "?".into(),
                    })
                    .collect();
                return Err(SimplifyError::ShapeMismatch {
                    name: name.clone(),
                    given: given.clone(),
                    declared: format!("[{}]", dims.join(",")),
                });
            }
        }
        t.shape = Some(TensorShapeProto {
            dim: given
                .iter()
                .map(|&d| Dimension {
                    denotation: None,
                    value: Some(dimension::Value::DimValue(d as i64)),
                })
                .collect(),
        });
        fixed.push((name.clone(), given.clone()));
    }
    Ok(fixed)
}

/// Stands for an unknown dim inside a partly known shape value.
const UNKNOWN_DIM: i64 = i64::MIN + 7;
/// Ops that only move elements: they carry partly known shape values.
const DATA_MOVEMENT: &[&str] = &[
    "Gather",
    "Slice",
    "Concat",
    "Unsqueeze",
    "Squeeze",
    "Identity",
    "Reshape",
    "Flatten",
];

/// The values one round folded, by tensor.
struct Folded {
    values: HashMap<TensorId, Value>,
    nodes: Vec<crate::graph::NodeId>,
}

/// One pass in topological order: every node whose inputs are known.
fn fold_round(graph: &Graph, options: &SimplifyOptions) -> Folded {
    let mut folded = Folded {
        values: HashMap::new(),
        nodes: Vec::new(),
    };
    let model = graph.model();
    let Some(g) = model.graph.as_ref() else {
        return folded;
    };
    let mut folder = Folder {
        graph,
        source: g,
        inits: g
            .initializer
            .iter()
            .filter_map(|t| Some((t.name.as_deref()?, t)))
            .collect(),
        opset: crate::onnx::attr::default_opset(model),
        known: HashMap::new(),
        partial: HashMap::new(),
    };
    let outputs: HashSet<TensorId> = graph.outputs.iter().copied().collect();
    for &id in graph.topo_ops() {
        let node = graph.node(id);
        let default_domain = node.domain.is_empty() || node.domain == "ai.onnx";
        let outs: Vec<TensorId> = node.outputs.iter().flatten().copied().collect();
        if !default_domain
            || node.has_subgraphs
            || outs.is_empty()
            || outs.iter().any(|t| outputs.contains(t))
            || inferred_output_bytes(graph, node) > fold_budget(graph, node, options)
        {
            continue;
        }
        let results = match folder.evaluate(node) {
            Some(Ok(v)) if v.len() == node.outputs.len() => v,
            Some(Err(partly)) => {
                if let Some(&t) = outs.first() {
                    folder.partial.insert(t, partly);
                }
                continue;
            }
            _ => continue,
        };
        let results: Vec<(TensorId, Value)> = node
            .outputs
            .iter()
            .zip(results)
            .filter_map(|(t, v)| Some(((*t)?, v)))
            .collect();
        if results
            .iter()
            .any(|(_, v)| v.as_ints().is_some_and(|i| i.contains(&UNKNOWN_DIM)))
        {
            // Still partly unknown: carried on, not folded.
            if let [(t, v)] = &results[..] {
                folder.partial.insert(*t, v.clone());
            }
            continue;
        }
        let bytes: u64 = results
            .iter()
            .map(|(_, v)| v.len() as u64 * v.elem.size_bytes().unwrap_or(8))
            .sum();
        if bytes > fold_budget(graph, node, options) {
            continue;
        }
        for (t, v) in results {
            folder.known.insert(t, v.clone());
            folded.values.insert(t, v);
        }
        folded.nodes.push(id);
    }
    folded
}

/// The state of one folding pass.
struct Folder<'g> {
    graph: &'g Graph,
    source: &'g crate::onnx::proto::GraphProto,
    inits: HashMap<&'g str, &'g crate::onnx::proto::TensorProto>,
    opset: i64,
    /// Values of constant tensors read so far and of folded outputs.
    known: HashMap<TensorId, Value>,
    /// Partly known shape values (UNKNOWN_DIM where a dim is not static).
    partial: HashMap<TensorId, Value>,
}

impl Folder<'_> {
    /// Whether `t` is constant, reading its value on first use
    /// (initializers past MAX_READ_ELEMS are not read).
    fn constant(&mut self, t: TensorId) -> bool {
        if self.known.contains_key(&t) {
            return true;
        }
        let tensor = self.graph.tensor(t);
        let producer = self.graph.node(tensor.producer);
        if producer.kind != NodeKind::Constant {
            return false;
        }
        let value = match producer.onnx_index.and_then(|i| self.source.node.get(i)) {
            Some(node) => constant_node_value(node),
            None => self
                .inits
                .get(tensor.name.as_str())
                .filter(|p| p.dims.iter().product::<i64>() <= MAX_READ_ELEMS as i64)
                .and_then(|p| Value::from_proto(p)),
        };
        value.map(|v| self.known.insert(t, v)).is_some()
    }

    /// The node's outputs (`Ok`), a partly known shape value (`Err`), or
    /// `None` where it does not fold.
    fn evaluate(&mut self, node: &crate::graph::Node) -> Option<Result<Vec<Value>, Value>> {
        let proto = node.onnx_index.and_then(|i| self.source.node.get(i))?;
        if let Some(v) = shape_value(self.graph, node, proto) {
            return Some(v);
        }
        let rule = crate::ops::entry(&node.op_type)?.fold?;
        // Checked before any initializer is read (an embedding table under
        // a Gather with variable indices is never decoded).
        let graph = self.graph;
        let from_constants = node.inputs.iter().flatten().all(|&t| {
            self.known.contains_key(&t)
                || graph.node(graph.tensor(t).producer).kind == NodeKind::Constant
        });
        let all_known = from_constants && node.inputs.iter().flatten().all(|&t| self.constant(t));
        // Partly known values only as the data moved (any input of a
        // Concat, input 0 of the others): indices, axes and targets must be
        // known.
        let carries_partial = !all_known
            && DATA_MOVEMENT.contains(&node.op_type.as_str())
            && node.inputs.iter().enumerate().all(|(k, t)| {
                t.is_none_or(|t| {
                    self.constant(t)
                        || (self.partial.contains_key(&t) && (k == 0 || node.op_type == "Concat"))
                })
            });
        if !all_known && !carries_partial {
            return None;
        }
        let args = Args {
            node: proto,
            inputs: input_values(&node.inputs, &self.known, &self.partial),
            opset: self.opset,
        };
        rule(&args).map(Ok)
    }
}

/// The values of `inputs`, known or partly known.
fn input_values<'a>(
    inputs: &[Option<TensorId>],
    known: &'a HashMap<TensorId, Value>,
    partial: &'a HashMap<TensorId, Value>,
) -> Vec<Option<&'a Value>> {
    inputs
        .iter()
        .map(|t| t.and_then(|t| known.get(&t).or_else(|| partial.get(&t))))
        .collect()
}

/// `Shape`/`Size` of a tensor with a static (or, for `Shape`, partly
/// static) shape. `Ok`: the value; `Err`: a partly known shape value.
fn shape_value(
    graph: &Graph,
    node: &crate::graph::Node,
    proto: &NodeProto,
) -> Option<Result<Vec<Value>, Value>> {
    if node.op_type != "Shape" && node.op_type != "Size" {
        return None;
    }
    let input = graph.tensor((*node.inputs.first()?)?);
    let dims = input.shape.as_ref()?;
    if node.op_type == "Size" {
        let n = crate::graph::numel(dims)?;
        let mut v = Value::ints(vec![i64::try_from(n).ok()?]);
        v.shape.clear();
        return Some(Ok(vec![v]));
    }
    let args = Args {
        node: proto,
        inputs: Vec::new(),
        opset: 0,
    };
    let values: Vec<i64> = dims[fold::shape_range(&args, dims.len())]
        .iter()
        .map(|d| d.known().unwrap_or(UNKNOWN_DIM))
        .collect();
    let complete = !values.contains(&UNKNOWN_DIM);
    let v = Value::ints(values);
    Some(if complete { Ok(vec![v]) } else { Err(v) })
}

/// How many bytes of outputs folding `node` may make: the cap, or more when
/// the constants it reads are read by nothing else and go with it (folding
/// a Transpose of a weight read once swaps the weight for its transposed
/// copy; a ConstantOfShape that makes a weight out of a shape stays, the
/// model would grow by the weight). A `Cast` of a weight read once folds
/// whatever its size: it is that weight in another type (float16 scales
/// stored for a float32 kernel), which the backend would hold anyway
/// (onnxruntime folds it at load); left an op, it would make a prologue
/// subgraph whose outputs cross to their consumers on every request.
fn fold_budget(graph: &Graph, node: &crate::graph::Node, options: &SimplifyOptions) -> u64 {
    let mut freed = 0u64;
    for &t in node.inputs.iter().flatten() {
        let tensor = graph.tensor(t);
        if graph.node(tensor.producer).kind != NodeKind::Constant || tensor.consumers.len() != 1 {
            return options.max_folded_bytes as u64;
        }
        freed += tensor.size_bytes().unwrap_or(0);
    }
    if freed > 0 && matches!(node.op_type.as_str(), "Cast" | "CastLike") {
        return u64::MAX;
    }
    freed.max(options.max_folded_bytes as u64)
}

/// Bytes of `node`'s outputs where inference knows their static sizes
/// (checked before evaluating, so an oversized result is never built).
fn inferred_output_bytes(graph: &Graph, node: &crate::graph::Node) -> u64 {
    node.outputs
        .iter()
        .flatten()
        .filter_map(|&t| graph.tensor(t).size_bytes())
        .sum()
}

/// The value of a `Constant` node.
fn constant_node_value(node: &NodeProto) -> Option<Value> {
    let a = node.attribute.first()?;
    match a.name.as_deref()? {
        "value" => Value::from_proto(a.t.as_ref()?),
        "value_int" => {
            let mut v = Value::ints(vec![a.i?]);
            v.shape.clear();
            Some(v)
        }
        "value_ints" => Some(Value::ints(a.ints.clone())),
        "value_float" => Some(Value {
            elem: crate::onnx::ElemType::FLOAT,
            shape: vec![],
            data: Data::Float(vec![f64::from(a.f?)]),
        }),
        "value_floats" => Some(Value {
            elem: crate::onnx::ElemType::FLOAT,
            shape: vec![a.floats.len()],
            data: Data::Float(a.floats.iter().map(|&f| f64::from(f)).collect()),
        }),
        _ => None,
    }
}

/// Removes the folded nodes; their outputs that are still read become
/// initializers.
fn rewrite(model: &mut ModelProto, graph: &Graph, folded: &Folded, report: &mut SimplifyReport) {
    let Some(g) = model.graph.as_mut() else {
        return;
    };
    let gone: HashSet<usize> = folded
        .nodes
        .iter()
        .filter_map(|&n| graph.node(n).onnx_index)
        .collect();
    for &n in &folded.nodes {
        let node = graph.node(n);
        report.folded.push(FoldedNode {
            node: node.name.clone(),
            op_type: node.op_type.clone(),
        });
    }
    let folded_names: HashSet<&str> = folded
        .values
        .keys()
        .map(|&t| graph.tensor(t).name.as_str())
        .collect();
    let mut index = 0;
    g.node.retain(|_| {
        index += 1;
        !gone.contains(&(index - 1))
    });
    g.value_info
        .retain(|v| !folded_names.contains(v.name.as_deref().unwrap_or("")));
    let folded_nodes: HashSet<crate::graph::NodeId> = folded.nodes.iter().copied().collect();
    let mut added: Vec<(&TensorId, &Value)> = folded.values.iter().collect();
    added.sort_by_key(|(t, _)| **t);
    for (&t, v) in added {
        let tensor = graph.tensor(t);
        let read = tensor.consumers.iter().any(|c| !folded_nodes.contains(c));
        if let (true, Some(dense)) = (read, v.to_tensor()) {
            g.initializer.push(dense.to_proto(&tensor.name));
        }
    }
}

/// Removes nodes that no graph output depends on, then unused
/// initializers and value_info. Returns the removed nodes, and apart the
/// names of the removed `Constant` nodes.
fn remove_dead(model: &mut ModelProto) -> (Vec<FoldedNode>, Vec<String>) {
    let Some(g) = model.graph.as_mut() else {
        return (Vec::new(), Vec::new());
    };
    let mut live: HashSet<String> = g.output.iter().filter_map(|v| v.name.clone()).collect();
    let mut keep = vec![false; g.node.len()];
    for (i, n) in g.node.iter().enumerate().rev() {
        if n.output.iter().any(|o| live.contains(o)) {
            keep[i] = true;
            live.extend(n.input.iter().filter(|s| !s.is_empty()).cloned());
            for a in &n.attribute {
                for body in a.g.iter().chain(&a.graphs) {
                    live.extend(crate::graph::free_names(body));
                }
            }
        }
    }
    let (mut dead, mut constants) = (Vec::new(), Vec::new());
    let mut i = 0;
    g.node.retain(|n| {
        i += 1;
        let name = n.name.clone().unwrap_or_default();
        match (keep[i - 1], n.op_type.as_deref()) {
            (true, _) => {}
            (false, Some("Constant")) => constants.push(name),
            (false, op) => dead.push(FoldedNode {
                node: name,
                op_type: op.unwrap_or_default().to_string(),
            }),
        }
        keep[i - 1]
    });
    let inputs: HashSet<String> = g.input.iter().filter_map(|v| v.name.clone()).collect();
    g.initializer.retain(|t| {
        let name = t.name.as_deref().unwrap_or("");
        live.contains(name) || inputs.contains(name)
    });
    g.value_info
        .retain(|v| live.contains(v.name.as_deref().unwrap_or("")));
    (dead, constants)
}
