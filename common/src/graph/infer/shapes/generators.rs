//! Ops that make tensors: their shape from an attribute, a constant input
//! or the input's rank.

use super::{rank, Rule, ShapeArgs};
use crate::graph::Dim;

pub(super) const RULES: &[(&str, Rule)] = &[
    (
        "Shape",
        Rule::First(|a| Some(vec![Dim::Known(a.input(0)?.len() as i64)])),
    ),
    ("Constant", Rule::First(constant)),
    ("ConstantOfShape", Rule::First(constant_of_shape)),
    ("Range", Rule::First(|_| Some(vec![Dim::Unknown]))),
    ("NonZero", Rule::First(|_| Some(vec![Dim::Unknown; 2]))),
];

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
