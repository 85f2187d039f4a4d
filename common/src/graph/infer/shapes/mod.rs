//! Static-shape rules: the shapes of an op's outputs, where a rule can
//! derive them. One file per op family, each with a table from op type to
//! its rule; [`output_shapes`] finds an op's rule through its entry in
//! [`crate::ops`], which joins these tables with the other concerns'.
//!
//! - [`elementwise`]: same shape as input 0 (unary ops, normalizations,
//!   Dropout's mask), broadcasting (binary ops, variadic Max/Min/Sum, Where)
//! - [`linalg`]: MatMul, Gemm
//! - [`conv_pool`]: Conv, pooling, global pooling
//! - [`movement`]: Transpose, Flatten, Reshape, Concat, Split, Slice,
//!   Expand, Gather, Squeeze/Unsqueeze, and the rank-preserving ops whose
//!   dims are not derived (Resize, Pad, …)
//! - [`reduce`]: Reduce*, ArgMax/ArgMin, TopK
//! - [`generators`]: Shape, Constant, ConstantOfShape, Range, NonZero
//! - [`control`]: If, LSTM/GRU/RNN

mod control;
mod conv_pool;
mod elementwise;
mod generators;
mod linalg;
mod movement;
mod reduce;

use crate::graph::Dim;
use crate::onnx::proto::NodeProto;

/// What a shape rule reads: the node, its inputs' shapes and the values of
/// inputs that are small integer constants.
pub(crate) struct ShapeArgs<'a> {
    pub node: &'a NodeProto,
    pub op: &'a str,
    in_shape: &'a dyn Fn(usize) -> Option<Vec<Dim>>,
    const_ints: &'a dyn Fn(usize) -> Option<Vec<i64>>,
}

impl ShapeArgs<'_> {
    /// Input `k`'s static shape, if known.
    pub fn input(&self, k: usize) -> Option<Vec<Dim>> {
        (self.in_shape)(k)
    }

    /// Input `k`'s values, if it is a small integer constant.
    pub fn ints(&self, k: usize) -> Option<Vec<i64>> {
        (self.const_ints)(k)
    }

    /// Whether input `k` is given (not absent, not the empty name).
    pub fn has_input(&self, k: usize) -> bool {
        self.node.input.get(k).is_some_and(|name| !name.is_empty())
    }

    /// How many outputs the node has.
    pub fn outputs(&self) -> usize {
        self.node.output.len()
    }
}

/// A shape rule.
#[derive(Clone, Copy)]
pub(crate) enum Rule {
    /// Output 0's shape; the other outputs stay unknown.
    First(fn(&ShapeArgs) -> Option<Vec<Dim>>),
    /// Every output's shape, in order (missing entries stay unknown).
    All(fn(&ShapeArgs) -> Vec<Option<Vec<Dim>>>),
}

/// Every family's table.
const FAMILIES: &[&[(&str, Rule)]] = &[
    elementwise::RULES,
    linalg::RULES,
    conv_pool::RULES,
    movement::RULES,
    reduce::RULES,
    generators::RULES,
    control::RULES,
];

/// Every family's rules, by op type.
pub(crate) fn rules() -> impl Iterator<Item = (&'static str, Rule)> {
    FAMILIES.iter().copied().flatten().copied()
}

/// Static shape of every output of `node` (default domain), where a rule
/// knows it.
pub(super) fn output_shapes(
    node: &NodeProto,
    in_shape: &dyn Fn(usize) -> Option<Vec<Dim>>,
    const_ints: &dyn Fn(usize) -> Option<Vec<i64>>,
) -> Vec<Option<Vec<Dim>>> {
    let op = node.op_type.as_deref().unwrap_or("");
    let args = ShapeArgs {
        node,
        op,
        in_shape,
        const_ints,
    };
    let shapes = match crate::ops::entry(op).and_then(|e| e.shape) {
        Some(Rule::First(rule)) => vec![rule(&args)],
        Some(Rule::All(rule)) => rule(&args),
        None => Vec::new(),
    };
    (0..args.outputs())
        .map(|k| shapes.get(k).cloned().flatten())
        .collect()
}

/// An ONNX axis (negative counts from the end) as an index in `0..=rank`.
fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 {
        axis.checked_add(rank as i64)?
    } else {
        axis
    };
    usize::try_from(a).ok().filter(|&a| a <= rank)
}

/// A rank read from the model, if plausible (a corrupt file must not make
/// us allocate a billion dimensions).
fn rank(len: i64) -> Option<usize> {
    usize::try_from(len).ok().filter(|&r| r <= 64)
}

/// Numpy-style broadcasting of two shapes; `None` where known dims clash.
fn broadcast(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            &a[i + a.len() - rank]
        } else {
            &Dim::Known(1)
        };
        let db = if i + b.len() >= rank {
            &b[i + b.len() - rank]
        } else {
            &Dim::Known(1)
        };
        out.push(match (da, db) {
            (Dim::Known(1), d) | (d, Dim::Known(1)) => d.clone(),
            (x, y) if x == y => x.clone(),
            (Dim::Known(_), Dim::Known(_)) => return None,
            _ => Dim::Unknown,
        });
    }
    Some(out)
}

/// The same shape `n` times (ops whose outputs all share one shape).
fn repeated(shape: Option<Vec<Dim>>, n: usize) -> Vec<Option<Vec<Dim>>> {
    vec![shape; n]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No op type is claimed by two families (the union would keep one).
    #[test]
    fn every_op_has_one_rule() {
        let listed: usize = FAMILIES.iter().map(|t| t.len()).sum();
        let ops: std::collections::HashSet<&str> = rules().map(|(op, _)| op).collect();
        assert_eq!(listed, ops.len(), "an op type is listed twice");
    }
}
