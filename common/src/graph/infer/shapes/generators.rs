//! Ops that make tensors: their shape from an attribute, a constant input
//! or the input's rank.

use super::{rank, Rule, ShapeArgs};
use crate::graph::Dim;
use crate::onnx::attr::attr_i;

pub(super) const RULES: &[(&str, Rule)] = &[
    ("Shape", Rule::First(shape)),
    ("Constant", Rule::First(constant)),
    ("ConstantOfShape", Rule::First(constant_of_shape)),
    ("Range", Rule::First(|_| Some(vec![Dim::Unknown]))),
    ("NonZero", Rule::First(|_| Some(vec![Dim::Unknown; 2]))),
];

/// As many dims as `start`..`end` (opset 15; negative from the end,
/// clamped) select of the input's rank.
fn shape(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let r = a.input(0)?.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r);
    let start = clamp(attr_i(a.node, "start").unwrap_or(0));
    let end = clamp(attr_i(a.node, "end").unwrap_or(r));
    Some(vec![Dim::Known((end - start).max(0))])
}

/// The value attribute's shape.
fn constant(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let value = a.node.attribute.first()?;
    match value.name.as_deref()? {
        "value" => Some(
            value
                .t
                .as_ref()?
                .dims
                .iter()
                .map(|&d| Dim::Known(d))
                .collect(),
        ),
        "value_float" | "value_int" | "value_string" => Some(vec![]),
        "value_floats" => Some(vec![Dim::Known(value.floats.len() as i64)]),
        "value_ints" => Some(vec![Dim::Known(value.ints.len() as i64)]),
        _ => None,
    }
}

/// The shape input's values, or as many unknown dims as it has.
fn constant_of_shape(a: &ShapeArgs) -> Option<Vec<Dim>> {
    match a.ints(0) {
        Some(dims) => Some(dims.into_iter().map(Dim::Known).collect()),
        None => Some(vec![Dim::Unknown; rank(a.input(0)?.first()?.known()?)?]),
    }
}
