//! Reductions over constant tensors (`ReduceProd` of a shape is the
//! element count a Reshape needs).

use super::{Args, Rule};
use crate::simplify::value::{axis, drop_axes, indices, strides, Value};

pub(super) const RULES: &[(&str, Rule)] = &[
    ("ReduceProd", |a| reduce(a, |v| v.iter().product())),
    ("ReduceSum", |a| reduce(a, |v| v.iter().sum())),
    ("ReduceMax", |a| {
        reduce(a, |v| v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
    }),
    ("ReduceMin", |a| {
        reduce(a, |v| v.iter().copied().fold(f64::INFINITY, f64::min))
    }),
    ("ReduceMean", |a| {
        reduce(a, |v| v.iter().sum::<f64>() / v.len().max(1) as f64)
    }),
];

fn reduce(a: &Args, f: fn(&[f64]) -> f64) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let rank = x.shape.len();
    // Axes: an attribute before opset 18 (13 for ReduceSum), an input since.
    let axes = a.ints_from("axes", 1).filter(|v| !v.is_empty());
    let axes: Vec<usize> = match axes {
        Some(v) => v.iter().map(|&k| axis(k, rank)).collect::<Option<_>>()?,
        None if a.int("noop_with_empty_axes").unwrap_or(0) != 0 => return Some(vec![x.clone()]),
        None => (0..rank).collect(),
    };
    let keep = a.int("keepdims").unwrap_or(1) != 0;
    let kept: Vec<usize> = x
        .shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let values = x.to_f64();
    let st = strides(&x.shape);
    let mut groups: Vec<Vec<f64>> = vec![Vec::new(); kept.iter().product()];
    let kept_st = strides(&kept);
    for idx in indices(&x.shape) {
        let src: usize = idx.iter().zip(&st).map(|(i, s)| i * s).sum();
        let dst: usize = idx
            .iter()
            .enumerate()
            .map(|(k, &i)| if axes.contains(&k) { 0 } else { i * kept_st[k] })
            .sum();
        groups[dst].push(values[src]);
    }
    let out: Vec<f64> = groups.iter().map(|g| f(g)).collect();
    let shape = if keep {
        kept
    } else {
        drop_axes(&x.shape, &axes)
    };
    Some(vec![Value::from_f64(x.elem, shape, out)?])
}
