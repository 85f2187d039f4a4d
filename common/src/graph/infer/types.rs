//! Element-type rules: the type of each output of an op, for every op of
//! the default domain up to opset 21 (and the common `com.microsoft`
//! contrib ops), as a table from op type to rule. An op with no rule keeps
//! its outputs untyped (never guessed), and the planner asks a plugin.
//! Lookups go through the op's entry in [`crate::ops`].

use super::super::build::tensor_type;
use super::{attr, attr_i};
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

/// What a rule sees.
pub(crate) struct TypeArgs<'a> {
    pub node: &'a NodeProto,
    pub in_type: &'a dyn Fn(usize) -> Option<ElemType>,
}

impl TypeArgs<'_> {
    fn outputs(&self) -> usize {
        self.node.output.len()
    }

    fn all(&self, t: Option<ElemType>) -> Vec<Option<ElemType>> {
        vec![t; self.outputs()]
    }

    /// `attr` as an element type, where set and not 0 (UNDEFINED).
    fn attr_type(&self, name: &str) -> Option<ElemType> {
        attr_i(self.node, name)
            .filter(|&v| v != 0)
            .and_then(|v| i32::try_from(v).ok())
            .map(ElemType)
    }
}

/// A type rule: each output's element type, where known.
pub(crate) type Rule = fn(&TypeArgs) -> Vec<Option<ElemType>>;

/// Ops whose every output has the type of input 0.
const SAME_AS_INPUT0: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Add",
    "AffineGrid",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "AveragePool",
    "BatchNormalization",
    "BitShift",
    "BitwiseAnd",
    "BitwiseNot",
    "BitwiseOr",
    "BitwiseXor",
    "CenterCropPad",
    "Ceil",
    "Celu",
    "Clip",
    "Col2Im",
    "Compress",
    "Concat",
    "Conv",
    "ConvTranspose",
    "Cos",
    "Cosh",
    "CumSum",
    "DFT",
    "DepthToSpace",
    "Det",
    "Div",
    "Einsum",
    "Elu",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Floor",
    "GRU",
    "Gather",
    "GatherElements",
    "GatherND",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalLpPool",
    "GlobalMaxPool",
    "GridSample",
    "GroupNormalization",
    "HardSigmoid",
    "HardSwish",
    "Hardmax",
    "Identity",
    "InstanceNormalization",
    "LRN",
    "LSTM",
    "LeakyRelu",
    "Log",
    "LogSoftmax",
    "LpNormalization",
    "LpPool",
    "MatMul",
    "Max",
    "MaxRoiPool",
    "MaxUnpool",
    "Mean",
    "MeanVarianceNormalization",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "Neg",
    "NegativeLogLikelihoodLoss",
    "PRelu",
    "Pad",
    "Pow",
    "RNN",
    "Range",
    "Reciprocal",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Relu",
    "Reshape",
    "Resize",
    "ReverseSequence",
    "RoiAlign",
    "Round",
    "STFT",
    "Scatter",
    "ScatterElements",
    "ScatterND",
    "Selu",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Slice",
    "Softmax",
    "SoftmaxCrossEntropyLoss",
    "Softplus",
    "Softsign",
    "SpaceToDepth",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Tan",
    "Tanh",
    "ThresholdedRelu",
    "Tile",
    "Transpose",
    "Trilu",
    "Unsqueeze",
    "Upsample",
    "RotaryEmbedding",
    "RMSNormalization",
    "Attention",
    // com.microsoft contrib ops that keep their input's type.
    "FusedConv",
    "FusedGemm",
    "FusedMatMul",
    "FastGelu",
    "BiasGelu",
    "QuickGelu",
    "BiasSoftmax",
    "BiasAdd",
    "NhwcConv",
    "GroupNorm",
    "MultiHeadAttention",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "GemmFastGelu",
    "QLinearAdd",
    "QLinearMul",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
    "QLinearAveragePool",
    "QLinearGlobalAveragePool",
    "QLinearSoftmax",
    "NhwcMaxPool",
    "Inverse",
    "DeformConv",
    // Sequence and optional ops: the IR types a sequence or an optional by
    // its elements' type.
    "SequenceConstruct",
    "SequenceInsert",
    "SequenceErase",
    "SequenceAt",
    "SplitToSequence",
    "ConcatFromSequence",
    "Optional",
    "OptionalGetElement",
];

const RULES: &[(&str, Rule)] = &[
    ("Cast", |a| a.all(a.attr_type("to"))),
    ("CastLike", |a| a.all((a.in_type)(1))),
    ("Shape", int64),
    ("Size", int64),
    ("ArgMax", int64),
    ("ArgMin", int64),
    ("NonZero", int64),
    ("NonMaxSuppression", int64),
    ("Equal", boolean),
    ("Less", boolean),
    ("Greater", boolean),
    ("LessOrEqual", boolean),
    ("GreaterOrEqual", boolean),
    ("Not", boolean),
    ("And", boolean),
    ("Or", boolean),
    ("Xor", boolean),
    ("IsNaN", boolean),
    ("IsInf", boolean),
    ("RegexFullMatch", boolean),
    ("StringNormalizer", string),
    ("StringConcat", string),
    ("StringSplit", |_| {
        vec![Some(ElemType::STRING), Some(ElemType::INT64)]
    }),
    ("TfIdfVectorizer", float),
    ("ImageDecoder", |a| a.all(Some(ElemType::UINT8))),
    ("Constant", constant),
    ("ConstantOfShape", |a| {
        let t = attr(a.node, "value")
            .and_then(|v| v.t.as_ref())
            .and_then(|t| t.data_type)
            .map(ElemType);
        a.all(t.or(Some(ElemType::FLOAT)))
    }),
    ("RandomNormal", |a| {
        a.all(a.attr_type("dtype").or(Some(ElemType::FLOAT)))
    }),
    ("RandomUniform", |a| {
        a.all(a.attr_type("dtype").or(Some(ElemType::FLOAT)))
    }),
    ("RandomNormalLike", |a| {
        a.all(a.attr_type("dtype").or((a.in_type)(0)))
    }),
    ("RandomUniformLike", |a| {
        a.all(a.attr_type("dtype").or((a.in_type)(0)))
    }),
    ("EyeLike", |a| {
        a.all(a.attr_type("dtype").or((a.in_type)(0)))
    }),
    ("Bernoulli", |a| {
        a.all(a.attr_type("dtype").or((a.in_type)(0)))
    }),
    ("Multinomial", |a| {
        a.all(a.attr_type("dtype").or(Some(ElemType::INT32)))
    }),
    ("MelWeightMatrix", window),
    ("BlackmanWindow", window),
    ("HannWindow", window),
    ("HammingWindow", window),
    ("TopK", |a| vec![(a.in_type)(0), Some(ElemType::INT64)]),
    ("MaxPool", |a| vec![(a.in_type)(0), Some(ElemType::INT64)]),
    ("Unique", |a| {
        let i = Some(ElemType::INT64);
        vec![(a.in_type)(0), i, i, i]
    }),
    ("Dropout", |a| vec![(a.in_type)(0), Some(ElemType::BOOL)]),
    ("LayerNormalization", |a| {
        let stash = a.attr_type("stash_type").or(Some(ElemType::FLOAT));
        vec![(a.in_type)(0), stash, stash]
    }),
    ("SkipLayerNormalization", |a| {
        let t = (a.in_type)(0);
        vec![t, Some(ElemType::FLOAT), Some(ElemType::FLOAT), t]
    }),
    ("EmbedLayerNormalization", |a| {
        vec![(a.in_type)(2), Some(ElemType::INT32), (a.in_type)(2)]
    }),
    ("QuantizeLinear", |a| {
        a.all(
            (a.in_type)(2)
                .or_else(|| a.attr_type("output_dtype"))
                .or(Some(ElemType::UINT8)),
        )
    }),
    ("DequantizeLinear", |a| a.all((a.in_type)(1))),
    ("DynamicQuantizeLinear", |_| {
        vec![
            Some(ElemType::UINT8),
            Some(ElemType::FLOAT),
            Some(ElemType::UINT8),
        ]
    }),
    ("QLinearConv", |a| a.all((a.in_type)(7).or((a.in_type)(0)))),
    ("QLinearMatMul", |a| {
        a.all((a.in_type)(7).or((a.in_type)(0)))
    }),
    ("MatMulInteger", |a| a.all(Some(ElemType::INT32))),
    ("ConvInteger", |a| a.all(Some(ElemType::INT32))),
    ("DynamicQuantizeMatMul", float),
    ("MatMulIntegerToFloat", float),
    ("DynamicQuantizeLSTM", float),
    ("QAttention", float),
    ("Where", |a| a.all((a.in_type)(1))),
    ("SequenceLength", int64),
    ("OptionalHasElement", boolean),
    ("SequenceEmpty", |a| {
        a.all(a.attr_type("dtype").or(Some(ElemType::FLOAT)))
    }),
    ("SequenceMap", |a| body_types(a, "body", 0)),
    ("OneHot", |a| a.all((a.in_type)(2))),
    ("If", |a| body_types(a, "then_branch", 0)),
    ("Loop", |a| body_types(a, "body", 1)),
    ("Scan", |a| body_types(a, "body", 0)),
];

fn int64(a: &TypeArgs) -> Vec<Option<ElemType>> {
    a.all(Some(ElemType::INT64))
}

fn boolean(a: &TypeArgs) -> Vec<Option<ElemType>> {
    a.all(Some(ElemType::BOOL))
}

fn string(a: &TypeArgs) -> Vec<Option<ElemType>> {
    a.all(Some(ElemType::STRING))
}

fn float(a: &TypeArgs) -> Vec<Option<ElemType>> {
    a.all(Some(ElemType::FLOAT))
}

fn window(a: &TypeArgs) -> Vec<Option<ElemType>> {
    a.all(a.attr_type("output_datatype").or(Some(ElemType::FLOAT)))
}

fn constant(a: &TypeArgs) -> Vec<Option<ElemType>> {
    let t = a
        .node
        .attribute
        .first()
        .and_then(|v| match v.name.as_deref()? {
            "value" => v.t.as_ref()?.data_type.map(ElemType),
            "sparse_value" => v
                .sparse_tensor
                .as_ref()?
                .values
                .as_ref()?
                .data_type
                .map(ElemType),
            "value_float" | "value_floats" => Some(ElemType::FLOAT),
            "value_int" | "value_ints" => Some(ElemType::INT64),
            "value_string" | "value_strings" => Some(ElemType::STRING),
            _ => None,
        });
    a.all(t)
}

/// Output `k` of a control-flow op: the body's output `k + skip` (Loop's
/// body first returns its condition).
fn body_types(a: &TypeArgs, body: &str, skip: usize) -> Vec<Option<ElemType>> {
    let g = attr(a.node, body).and_then(|v| v.g.as_ref());
    (0..a.outputs())
        .map(|k| {
            g.and_then(|g| g.output.get(k + skip))
                .and_then(|v| v.r#type.as_ref())
                .and_then(|tp| tensor_type(tp).0)
        })
        .collect()
}

/// Every op's type rule, by op type (the ops whose outputs all have input
/// 0's type share one rule).
pub(crate) fn rules() -> impl Iterator<Item = (&'static str, Rule)> {
    let same: Rule = |a| a.all((a.in_type)(0));
    let same = SAME_AS_INPUT0.iter().map(move |&op| (op, same));
    // An op in both lists keeps its own rule (later entries win).
    same.chain(RULES.iter().copied())
}

/// Element type of each output, where a rule knows it.
pub(super) fn output_types(
    node: &NodeProto,
    in_type: &dyn Fn(usize) -> Option<ElemType>,
) -> Vec<Option<ElemType>> {
    let op = node.op_type.as_deref().unwrap_or("");
    match crate::ops::entry(op).and_then(|e| e.types) {
        Some(rule) => rule(&TypeArgs { node, in_type }),
        None => vec![None; node.output.len()],
    }
}
