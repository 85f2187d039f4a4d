//! Element-type rules: the type of each output of an op, where known.

use super::super::build::tensor_type;
use super::{attr, attr_i};
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

/// Element type of each output, where a rule knows it.
pub(super) fn output_types(
    node: &NodeProto,
    in_type: &dyn Fn(usize) -> Option<ElemType>,
) -> Vec<Option<ElemType>> {
    let op = node.op_type.as_deref().unwrap_or("");
    let n = node.output.len();
    let all = |t: Option<ElemType>| vec![t; n];
    let from_attr_tensor = |name: &str| {
        attr(node, name)
            .and_then(|a| a.t.as_ref())
            .and_then(|t| t.data_type)
            .map(ElemType)
    };
    match op {
        "Cast" => all(attr_i(node, "to").map(|v| ElemType(v as i32))),
        "CastLike" => all(in_type(1)),
        "Shape" | "Size" | "ArgMax" | "ArgMin" | "NonZero" | "NonMaxSuppression" => {
            all(Some(ElemType::INT64))
        }
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "Not" | "And" | "Or"
        | "Xor" | "IsNaN" | "IsInf" => all(Some(ElemType::BOOL)),
        "Constant" => {
            let a = node.attribute.first();
            let t = a.and_then(|a| match a.name.as_deref()? {
                "value" => a.t.as_ref()?.data_type.map(ElemType),
                "value_float" | "value_floats" => Some(ElemType::FLOAT),
                "value_int" | "value_ints" => Some(ElemType::INT64),
                "value_string" | "value_strings" => Some(ElemType::STRING),
                _ => None,
            });
            all(t)
        }
        "ConstantOfShape" => all(from_attr_tensor("value").or(Some(ElemType::FLOAT))),
        "RandomNormal" | "RandomUniform" | "EyeLike" | "RandomNormalLike" | "RandomUniformLike"
        | "Multinomial" => {
            let default = if op.ends_with("Like") {
                in_type(0)
            } else if op == "Multinomial" {
                Some(ElemType::INT32)
            } else {
                Some(ElemType::FLOAT)
            };
            all(attr_i(node, "dtype")
                .map(|v| ElemType(v as i32))
                .or(default))
        }
        "TopK" => vec![in_type(0), Some(ElemType::INT64)],
        "MaxPool" => vec![in_type(0), Some(ElemType::INT64)],
        "Unique" => vec![
            in_type(0),
            Some(ElemType::INT64),
            Some(ElemType::INT64),
            Some(ElemType::INT64),
        ],
        "QuantizeLinear" => all(in_type(2)
            .or_else(|| {
                attr_i(node, "output_dtype")
                    .filter(|&v| v != 0)
                    .map(|v| ElemType(v as i32))
            })
            .or(Some(ElemType::UINT8))),
        "DequantizeLinear" => all(in_type(1)),
        "DynamicQuantizeLinear" => vec![
            Some(ElemType::UINT8),
            Some(ElemType::FLOAT),
            Some(ElemType::UINT8),
        ],
        "Where" => all(in_type(1)),
        "If" => {
            let branch = attr(node, "then_branch").and_then(|a| a.g.as_ref());
            (0..n)
                .map(|k| {
                    branch
                        .and_then(|g| g.output.get(k))
                        .and_then(|v| v.r#type.as_ref())
                        .and_then(|tp| tensor_type(tp).0)
                })
                .collect()
        }
        "Loop" | "Scan" => {
            let body = attr(node, "body").and_then(|a| a.g.as_ref());
            let skip = usize::from(op == "Loop");
            (0..n)
                .map(|k| {
                    body.and_then(|g| g.output.get(k + skip))
                        .and_then(|v| v.r#type.as_ref())
                        .and_then(|tp| tensor_type(tp).0)
                })
                .collect()
        }
        _ => all(in_type(0)),
    }
}
