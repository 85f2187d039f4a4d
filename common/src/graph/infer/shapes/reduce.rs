//! Reductions over axes, and TopK.

use super::{norm_axis, repeated, Rule, ShapeArgs};
use crate::graph::Dim;
use crate::onnx::attr::{attr_i, attr_ints};

pub(super) const RULES: &[(&str, Rule)] = &[
    ("ReduceMean", REDUCE),
    ("ReduceSum", REDUCE),
    ("ReduceMax", REDUCE),
    ("ReduceMin", REDUCE),
    ("ReduceProd", REDUCE),
    ("ReduceL1", REDUCE),
    ("ReduceL2", REDUCE),
    ("ReduceLogSumExp", REDUCE),
    ("ReduceSumSquare", REDUCE),
    ("ArgMax", REDUCE),
    ("ArgMin", REDUCE),
    // Values and indices: one shape.
    ("TopK", Rule::All(|a| repeated(topk(a), a.outputs()))),
];

const REDUCE: Rule = Rule::First(reduce);

/// The reduced axes dropped, or kept as 1 with keepdims.
fn reduce(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let x = a.input(0)?;
    let keep = attr_i(a.node, "keepdims").unwrap_or(1) != 0;
    let given = attr_ints(a.node, "axes").map(<[i64]>::to_vec).or_else(|| {
        if a.node.input.len() > 1 {
            a.ints(1)
        } else {
            None
        }
    });
    let axes = match given {
        Some(axes) => axes,
        None if a.op.starts_with("Arg") => vec![attr_i(a.node, "axis").unwrap_or(0)],
        // Axes from an input whose values are not known here.
        None if a.has_input(1) => return None,
        None if attr_i(a.node, "noop_with_empty_axes").unwrap_or(0) != 0 => return Some(x),
        None => (0..x.len() as i64).collect(),
    };
    let axes: Vec<usize> = axes.iter().filter_map(|&v| norm_axis(v, x.len())).collect();
    Some(
        x.into_iter()
            .enumerate()
            .filter_map(|(i, d)| match (axes.contains(&i), keep) {
                (false, _) => Some(d),
                (true, true) => Some(Dim::Known(1)),
                (true, false) => None,
            })
            .collect(),
    )
}

/// The input's shape with the axis dim `k`.
fn topk(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let mut x = a.input(0)?;
    let axis = norm_axis(attr_i(a.node, "axis").unwrap_or(-1), x.len())?;
    let k = attr_i(a.node, "k").or_else(|| a.ints(1)?.first().copied());
    *x.get_mut(axis)? = k.map_or(Dim::Unknown, Dim::Known);
    Some(x)
}
