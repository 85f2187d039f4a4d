//! Op decomposition: ONNX ops a backend lacks, rewritten as standard ONNX ops
//! it has (what an OpenVINO plugin's transformations do before QueryNetwork
//! and compilation). The ONNX function ops (NegativeLogLikelihoodLoss,
//! SoftmaxCrossEntropyLoss, CenterCropPad, AffineGrid) and LpPool are
//! rewritten along the lines of their ONNX function bodies, the training
//! optimizers (Adagrad, Momentum, Adam) after their specifications, and a
//! linear or cubic Resize with align_corners as constant interpolation
//! matrices.
//!
//! A plugin decomposes the model it is asked about and the subgraph it
//! compiles the same way, and maps what it learns about the expansion back
//! to the original node: expansion nodes are named `<original>.d<k>` and
//! [`Decomposed::origin`] records the original name of each, so the
//! original node is supported exactly when all its expansion nodes are.
//!
//! A rule declines a node it cannot rewrite exactly (an attribute value it
//! does not handle, a shape that is not static where it must be); the node
//! is then left as it is, and the backend decides.
//!
//! # Example
//!
//! ```
//! use tessera_common::decompose::decompose;
//! use tessera_common::graph::Graph;
//! use tessera_common::onnx::{proto::*, tensor_info};
//! use tessera_common::synth::node;
//!
//! let mut lp = node("pool", "LpPool", &["x"], &["y"]);
//! lp.attribute.push(AttributeProto {
//!     name: Some("kernel_shape".into()),
//!     ints: vec![2, 2],
//!     r#type: Some(attribute_proto::AttributeType::Ints as i32),
//!     ..Default::default()
//! });
//! let model = ModelProto {
//!     ir_version: Some(8),
//!     opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(18) }],
//!     graph: Some(GraphProto {
//!         node: vec![lp],
//!         input: vec![tensor_info("x", 1, &[1, 1, 4, 4])],
//!         output: vec![tensor_info("y", 1, &[1, 1, 3, 3])],
//!         ..Default::default()
//!     }),
//!     ..Default::default()
//! };
//! let graph = Graph::from_model(model)?;
//! let d = decompose(&graph, |op| op == "LpPool");
//! let ops: Vec<_> = d.model.graph.unwrap().node.iter().map(|n| n.op_type.clone().unwrap()).collect();
//! assert_eq!(ops, ["Abs", "Pow", "AveragePool", "Mul", "Pow"]);
//! assert_eq!(d.origin["pool.d2"], "pool");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod emit;
mod layout;
mod loss;
mod misc;
mod pool;
mod quant;
mod recurrent;
mod resize;
mod training;
mod types;

use crate::declined::{invalid, unknown, Declined};
use std::collections::HashMap;

use crate::graph::{Dim, Graph};
use crate::onnx::proto::{ModelProto, NodeProto, TensorProto};
use crate::onnx::ElemType;
use crate::tensor::Tensor;

pub(crate) use crate::onnx::attr::{attr, attr_i, attr_ints, attr_s, input};
pub use emit::Emit;

/// A model after decomposition.
#[derive(Debug, Clone)]
pub struct Decomposed {
    pub model: ModelProto,
    /// Expansion node name → the original node it replaces.
    pub origin: HashMap<String, String>,
    /// Nodes a rule declined, with the reason (they are left as they are).
    pub declined: HashMap<String, Declined>,
}

impl Decomposed {
    /// The original node an (expanded or untouched) node stands for.
    pub fn original<'a>(&'a self, node: &'a str) -> &'a str {
        self.origin.get(node).map(String::as_str).unwrap_or(node)
    }
}

/// What a rule can ask about the model: element types, static shapes and
/// constant values of tensors, and the default-domain opset.
pub struct Context<'a> {
    graph: &'a Graph,
    initializers: HashMap<&'a str, &'a TensorProto>,
    pub opset: i64,
}

impl Context<'_> {
    /// The element type of tensor `name`, where known.
    pub fn elem(&self, name: &str) -> Option<ElemType> {
        self.graph
            .tensor(self.graph.tensor_by_name(name)?)
            .elem_type
    }

    /// The fully static shape of tensor `name`.
    pub fn static_shape(&self, name: &str) -> Option<Vec<i64>> {
        let t = self.graph.tensor(self.graph.tensor_by_name(name)?);
        t.shape.as_ref()?.iter().map(Dim::known).collect()
    }

    /// The element type of input `name`, or the reason a rule that needs
    /// it declines.
    pub fn input_elem(&self, name: &str) -> Result<ElemType, Declined> {
        self.elem(name)
            .ok_or_else(|| unknown("input of unknown type"))
    }

    /// The static shape of input `name`, or the reason a rule that needs
    /// it declines.
    pub fn input_shape(&self, name: &str) -> Result<Vec<i64>, Declined> {
        self.static_shape(name)
            .ok_or_else(|| unknown("input shape is not static"))
    }

    /// The rank of tensor `name`, where known.
    pub fn rank(&self, name: &str) -> Option<usize> {
        let t = self.graph.tensor(self.graph.tensor_by_name(name)?);
        t.shape.as_ref().map(Vec::len)
    }

    /// Whether tensor `name` is a constant (an initializer or the output of
    /// an input-less `Constant` node).
    pub fn is_constant(&self, name: &str) -> bool {
        self.graph.tensor_by_name(name).is_some_and(|t| {
            self.graph.node(self.graph.tensor(t).producer).kind == crate::graph::NodeKind::Constant
        })
    }

    /// The values of a float or boolean initializer, as f64.
    pub fn const_floats(&self, name: &str) -> Option<Vec<f64>> {
        let t = Tensor::from_proto(self.initializers.get(name)?).ok()?;
        match t.elem() {
            ElemType::FLOAT => t
                .to_vec::<f32>()
                .ok()
                .map(|v| v.into_iter().map(f64::from).collect()),
            ElemType::DOUBLE => t.to_vec::<f64>().ok(),
            ElemType::BOOL => t
                .to_vec::<bool>()
                .ok()
                .map(|v| v.into_iter().map(|b| f64::from(u8::from(b))).collect()),
            _ => None,
        }
    }

    /// The values of an integer initializer (`int64` or `int32`).
    pub fn const_ints(&self, name: &str) -> Option<Vec<i64>> {
        Tensor::from_proto(self.initializers.get(name)?)
            .ok()?
            .int_values()
    }
}

/// A rule: writes the expansion of `node` into `emit`, or declines with a
/// reason.
pub(crate) type Rule = fn(&NodeProto, &Context, &mut Emit) -> Result<(), Declined>;

/// The ops that have a decomposition rule, with their rules.
const RULES: &[(&str, Rule)] = &[
    ("NegativeLogLikelihoodLoss", loss::negative_log_likelihood),
    ("SoftmaxCrossEntropyLoss", loss::softmax_cross_entropy),
    ("LpPool", pool::lp_pool),
    ("CenterCropPad", layout::center_crop_pad),
    ("AffineGrid", layout::affine_grid),
    ("Col2Im", layout::col2im),
    ("ReverseSequence", layout::reverse_sequence),
    ("MaxUnpool", pool::max_unpool),
    ("AveragePool", pool::dilated_average_pool),
    ("QuantizeLinear", quant::quantize_linear),
    ("DequantizeLinear", quant::dequantize_linear),
    ("QLinearMatMul", quant::qlinear_matmul),
    ("BitShift", types::bit_shift),
    ("Compress", misc::compress),
    ("Det", misc::det),
    ("Dropout", misc::dropout),
    ("OptionalHasElement", misc::optional_has_element),
    ("OptionalGetElement", misc::optional_get_element),
    ("BatchNormalization", misc::batch_norm_training),
    ("Upsample", layout::upsample_nearest),
    ("Pad", layout::wrap_pad),
    ("ReduceMax", types::reduce_bool),
    ("ReduceMin", types::reduce_bool),
    ("Max", types::widen_16bit),
    ("Min", types::widen_16bit),
    ("Pow", types::signed_exponent),
    ("Cast", types::saturating_cast_4bit),
    ("Resize", resize::align_corners_by_matrices),
    ("RNN", recurrent::batch_first),
    ("GRU", recurrent::batch_first),
    ("LSTM", recurrent::batch_first),
];

/// Rules for ops of the `ai.onnx.ml` domain.
const ML_RULES: &[(&str, Rule)] = &[
    ("Binarizer", misc::binarizer),
    ("ArrayFeatureExtractor", misc::array_feature_extractor),
];

/// Rules for the optimizers of the `ai.onnx.preview.training` domain.
const TRAINING_RULES: &[(&str, Rule)] = &[
    ("Adagrad", training::adagrad),
    ("Momentum", training::momentum),
    ("Adam", training::adam),
];

/// The default-domain opset expansions are written at in a model that
/// imports only other domains (e.g. `ai.onnx.ml`); the model then gains
/// this import.
const EXPANSION_OPSET: i64 = 13;

/// The default domain's rules, by op type.
pub(crate) fn rules() -> impl Iterator<Item = (&'static str, Rule)> {
    RULES.iter().copied()
}

/// The op types [`decompose`] can rewrite.
pub fn decomposable_ops() -> impl Iterator<Item = &'static str> {
    RULES
        .iter()
        .chain(ML_RULES)
        .chain(TRAINING_RULES)
        .map(|(op, _)| *op)
}

/// Rewrites the nodes of `graph`'s (name-normalized) model whose op type has
/// a rule and for which `wanted(op_type)` holds. Nodes a rule declines stay
/// as they are.
pub fn decompose(graph: &Graph, wanted: impl Fn(&str) -> bool) -> Decomposed {
    decompose_where(graph, |node| wanted(node.op_type.as_deref().unwrap_or("")))
}

/// [`decompose`] for the nodes `wanted` picks (e.g. by name: the nodes a
/// backend refused).
pub fn decompose_where(graph: &Graph, wanted: impl Fn(&NodeProto) -> bool) -> Decomposed {
    let model = graph.model();
    let default_opset = crate::onnx::attr::declared_default_opset(model);
    let opset = default_opset.unwrap_or(EXPANSION_OPSET);
    let mut out = model.clone();
    let mut origin = HashMap::new();
    let mut declined = HashMap::new();
    let Some(source) = model.graph.as_ref() else {
        return Decomposed {
            model: out,
            origin,
            declined,
        };
    };
    let ctx = Context {
        graph,
        initializers: source
            .initializer
            .iter()
            .filter_map(|t| Some((t.name.as_deref()?, t)))
            .collect(),
        opset,
    };
    let mut nodes = Vec::with_capacity(source.node.len());
    let mut initializers = Vec::new();
    for node in &source.node {
        let op = node.op_type.as_deref().unwrap_or("");
        let in_domain =
            |rules: &[(&str, Rule)]| rules.iter().find(|(name, _)| *name == op).map(|(_, r)| *r);
        let rule = match node.domain.as_deref() {
            None | Some("") | Some("ai.onnx") => crate::ops::entry(op).and_then(|e| e.decompose),
            Some("ai.onnx.ml") => in_domain(ML_RULES),
            Some("ai.onnx.preview.training") => in_domain(TRAINING_RULES),
            Some(_) => None,
        };
        let Some(rule) = rule.filter(|_| wanted(node)) else {
            nodes.push(node.clone());
            continue;
        };
        let name = node.name.clone().unwrap_or_default();
        let mut emit = Emit::new(&name, opset);
        match rule(node, &ctx, &mut emit) {
            Ok(()) => {
                let (expansion, constants) = emit.finish();
                for n in &expansion {
                    origin.insert(n.name.clone().unwrap_or_default(), name.clone());
                }
                nodes.extend(expansion);
                initializers.extend(constants);
            }
            Err(why) => {
                declined.insert(name, why.map(|why| format!("{op} not decomposed: {why}")));
                nodes.push(node.clone());
            }
        }
    }
    if let Some(g) = out.graph.as_mut() {
        g.node = nodes;
        g.initializer.extend(initializers);
    }
    if default_opset.is_none() && !origin.is_empty() {
        out.opset_import
            .push(crate::onnx::proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(EXPANSION_OPSET),
            });
    }
    Decomposed {
        model: out,
        origin,
        declined,
    }
}

/// The data input (0) and output (0) of `node`.
pub(crate) fn data_io(node: &NodeProto) -> Result<(&str, &str), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    Ok((x, y))
}

/// Output `k` of `node` where present and not the empty name.
pub(crate) fn output(node: &NodeProto, k: usize) -> Option<&str> {
    node.output
        .get(k)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests;
