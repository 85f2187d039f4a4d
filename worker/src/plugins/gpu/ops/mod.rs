//! The GPU plugin's operators: what each supports exactly ([`check`], used
//! by QueryNetwork and compile), and how each is planned into kernel
//! launches for concrete shapes ([`plan`]). One file per op family.

mod codes;
mod conv;
mod elementwise;
mod layout;
mod linear;
mod reduce;
mod resize;

use tessera_common::declined::{invalid, unknown, unsupported, Declined};
use tessera_common::onnx::proto::{NodeProto, ValueInfoProto};
use tessera_common::onnx::ElemType;
use tessera_common::tensor::Tensor;

use super::builder::Builder;
pub use tessera_common::onnx::attr::{
    attr_f, attr_i, attr_ints, attr_s, default_opset as opset, input,
};

/// Every op type this plugin runs, with the kernels it launches (Cast's
/// need shader-f16: compiled when planned).
pub const OPS: &[(&str, &[&str])] = &[
    ("Add", &["binary"]),
    ("Sub", &["binary"]),
    ("Mul", &["binary"]),
    ("Div", &["binary"]),
    ("Pow", &["binary"]),
    ("Max", &["binary", "unary"]),
    ("Min", &["binary", "unary"]),
    ("Relu", &["unary"]),
    ("LeakyRelu", &["unary"]),
    ("Sigmoid", &["unary"]),
    ("Tanh", &["unary"]),
    ("HardSigmoid", &["unary"]),
    ("HardSwish", &["unary"]),
    ("Clip", &["unary"]),
    ("Erf", &["unary"]),
    ("Gelu", &["unary"]),
    ("Exp", &["unary"]),
    ("Neg", &["unary"]),
    ("Abs", &["unary"]),
    ("Sqrt", &["unary"]),
    ("Reciprocal", &["unary"]),
    ("Elu", &["unary"]),
    ("Log", &["unary"]),
    ("Floor", &["unary"]),
    ("Ceil", &["unary"]),
    ("Identity", &["unary"]),
    ("BatchNormalization", &["batchnorm"]),
    ("MatMul", &["gemm"]),
    ("Gemm", &["gemm"]),
    ("Conv", &["conv", "conv_gemm", "conv_splitk"]),
    ("ConvTranspose", &["convtranspose"]),
    ("ReduceSum", &["reduce", "unary"]),
    ("ReduceMean", &["reduce", "unary"]),
    ("ReduceMax", &["reduce", "unary"]),
    ("ReduceMin", &["reduce", "unary"]),
    ("LayerNormalization", &["layernorm"]),
    ("Resize", &["resize"]),
    ("MaxPool", &["pool"]),
    ("AveragePool", &["pool"]),
    ("GlobalAveragePool", &["global_pool"]),
    ("GlobalMaxPool", &["global_pool"]),
    ("Softmax", &["softmax", "softmax_rows"]),
    ("LogSoftmax", &["softmax", "softmax_rows"]),
    ("Reshape", &[]),
    ("Flatten", &[]),
    ("Squeeze", &[]),
    ("Unsqueeze", &[]),
    ("Transpose", &["copy"]),
    ("Concat", &["copy"]),
    ("Slice", &["copy"]),
    ("Split", &["copy"]),
    ("Expand", &["copy"]),
    ("Cast", &[]),
];

/// The kernels `op_type` launches.
pub fn kernels(op_type: &str) -> &'static [&'static str] {
    OPS.iter()
        .find(|(o, _)| *o == op_type)
        .map_or(&[], |(_, k)| *k)
}

/// Element type and shape (`None`: dynamic) of a graph input or output.
pub fn value_type(v: &ValueInfoProto) -> (ElemType, Vec<Option<usize>>) {
    use tessera_common::onnx::proto::tensor_shape_proto::dimension::Value as D;
    use tessera_common::onnx::proto::type_proto::Value;
    match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(Value::TensorType(t)) => {
            let dims = t
                .shape
                .as_ref()
                .map(|s| {
                    s.dim
                        .iter()
                        .map(|d| match d.value {
                            Some(D::DimValue(n)) if n >= 0 => Some(n as usize),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            (ElemType(t.elem_type()), dims)
        }
        _ => (ElemType::UNDEFINED, Vec::new()),
    }
}

/// The value of an input-less `Constant` node.
pub fn constant_value(node: &NodeProto) -> Result<Tensor, Declined> {
    let attr = node
        .attribute
        .first()
        .ok_or_else(|| invalid(format!("Constant {} has no value", node.name())))?;
    let err = |e: tessera_common::tensor::TensorError| invalid(e.to_string());
    match (attr.name(), &attr.t) {
        ("value", Some(t)) => Tensor::from_proto(t).map_err(err),
        ("value_float", _) => {
            Tensor::new(ElemType::FLOAT, vec![], attr.f().to_le_bytes().to_vec()).map_err(err)
        }
        ("value_floats", _) => Tensor::new(
            ElemType::FLOAT,
            vec![attr.floats.len()],
            attr.floats
                .iter()
                .flat_map(|f| f.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
        .map_err(err),
        ("value_int", _) => {
            Tensor::new(ElemType::INT64, vec![], attr.i().to_le_bytes().to_vec()).map_err(err)
        }
        ("value_ints", _) => Tensor::new(
            ElemType::INT64,
            vec![attr.ints.len()],
            attr.ints
                .iter()
                .flat_map(|i| i.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
        .map_err(err),
        (other, _) => Err(unsupported(format!(
            "Constant with '{other}' is not supported"
        ))),
    }
}

/// The node's attributes not in `known`: any is a reason to refuse it.
fn unknown_attrs(node: &NodeProto, known: &[&str]) -> Result<(), Declined> {
    match node.attribute.iter().find(|a| !known.contains(&a.name())) {
        Some(a) => Err(unsupported(format!(
            "attribute '{}' is not supported",
            a.name()
        ))),
        None => Ok(()),
    }
}

/// Whether this plugin runs `node` exactly (element types are checked by
/// QueryNetwork, which knows them; constants by [`plan`]).
pub fn check(node: &NodeProto, opset: i64) -> Result<(), Declined> {
    if !node.domain().is_empty() && node.domain() != "ai.onnx" {
        return Err(unsupported(format!(
            "domain '{}' is not supported",
            node.domain()
        )));
    }
    match node.op_type() {
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Max" | "Min" | "Relu" | "LeakyRelu"
        | "Sigmoid" | "Tanh" | "HardSigmoid" | "HardSwish" | "Clip" | "Erf" | "Gelu" | "Exp"
        | "Neg" | "Abs" | "Sqrt" | "Reciprocal" | "Elu" | "Log" | "Floor" | "Ceil" | "Identity"
        | "BatchNormalization" => elementwise::check(node, opset),
        "MatMul" | "Gemm" => linear::check(node),
        "Conv" | "MaxPool" | "AveragePool" | "GlobalAveragePool" | "GlobalMaxPool" => {
            conv::check(node)
        }
        "Softmax" | "LogSoftmax" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze"
        | "Transpose" | "Concat" | "Slice" | "Split" | "Expand" | "Cast" => {
            layout::check(node, opset)
        }
        "ConvTranspose" => conv::check(node),
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "LayerNormalization" => {
            reduce::check(node)
        }
        "Resize" => resize::check(node, opset),
        other => Err(unsupported(format!(
            "{other} is not implemented on the GPU"
        ))),
    }
}

/// Whether the ranks of `node`'s first input (`None`: unknown) fit its
/// kernels.
pub fn check_rank(node: &NodeProto, rank: Option<usize>) -> Result<(), Declined> {
    let fits = match node.op_type() {
        "Conv" | "ConvTranspose" | "MaxPool" | "AveragePool" | "GlobalAveragePool"
        | "GlobalMaxPool" => rank.is_some_and(|r| r == 3 || r == 4),
        "Resize" => rank == Some(4),
        "Gemm" => rank == Some(2),
        "MatMul" => rank.is_some_and(|r| (1..=6).contains(&r)),
        _ => rank.is_none_or(|r| r <= MAX_RANK),
    };
    if fits {
        Ok(())
    } else {
        Err(match rank {
            Some(r) => unsupported(format!("input of rank {r} is not supported")),
            None => unknown("input of unknown rank"),
        })
    }
}

/// Which inputs of `node` must be constants (shapes, axes, clip bounds,
/// batch-norm statistics are fine as GPU buffers).
pub fn const_inputs(node: &NodeProto) -> &'static [usize] {
    match node.op_type() {
        "Reshape" | "Expand" => &[1],
        "Squeeze" | "Unsqueeze" | "Split" => &[1],
        "Slice" => &[1, 2, 3, 4],
        "Resize" => &[1, 2, 3],
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" => &[1],
        "Clip" => &[1, 2],
        _ => &[],
    }
}

/// How `node` stores its outputs: like its float inputs (f32 or f16, all
/// alike; shape-like constants are read on the host), or Cast's `to`.
pub fn storage(b: &Builder, node: &NodeProto) -> Result<ElemType, Declined> {
    if node.op_type() == "Cast" {
        return layout::cast_target(node);
    }
    let consts = const_inputs(node);
    let mut elem = None;
    for (i, name) in node.input.iter().enumerate() {
        if name.is_empty() || consts.contains(&i) {
            continue;
        }
        match b.elem_of(name) {
            Some(e) if e == ElemType::FLOAT || e == ElemType::FLOAT16 => {
                if elem.is_some_and(|x| x != e) {
                    return Err(unsupported("float and float16 inputs mixed"));
                }
                elem = Some(e);
            }
            _ => {}
        }
    }
    Ok(elem.unwrap_or(ElemType::FLOAT))
}

/// Plans `node` for the shapes known to `b`.
pub fn plan(b: &mut Builder, node: &NodeProto) -> Result<(), Declined> {
    match node.op_type() {
        "MatMul" | "Gemm" => linear::plan(b, node),
        "Conv" | "MaxPool" | "AveragePool" | "GlobalAveragePool" | "GlobalMaxPool" => {
            conv::plan(b, node)
        }
        "Softmax" | "LogSoftmax" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze"
        | "Transpose" | "Concat" | "Slice" | "Split" | "Expand" | "Cast" => layout::plan(b, node),
        "ConvTranspose" => conv::plan(b, node),
        "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "LayerNormalization" => {
            reduce::plan(b, node)
        }
        "Resize" => resize::plan(b, node),
        _ => elementwise::plan(b, node),
    }
}

/// `axis` (possibly negative) of a rank-`rank` tensor.
pub fn axis(axis: i64, rank: usize) -> Result<usize, Declined> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a as usize >= rank.max(1) {
        return Err(invalid(format!("axis {axis} out of range for rank {rank}")));
    }
    Ok(a as usize)
}

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Kernels take shapes of rank up to this.
pub const MAX_RANK: usize = 6;

/// `v` padded with `fill` to `n` entries.
pub fn padded(v: &[u32], n: usize, fill: u32) -> Vec<u32> {
    let mut out = v.to_vec();
    out.resize(n, fill);
    out
}
