//! Matrix products.

use super::{broadcast, Rule, ShapeArgs};
use crate::graph::Dim;
use crate::onnx::attr::attr_i;

pub(super) const RULES: &[(&str, Rule)] =
    &[("MatMul", Rule::First(matmul)), ("Gemm", Rule::First(gemm))];

/// numpy's matmul: batch dims broadcast, 1-D operands promoted and their
/// added dim dropped again.
fn matmul(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let (x, w) = (a.input(0)?, a.input(1)?);
    if x.is_empty() || w.is_empty() {
        return None;
    }
    let x2 = if x.len() == 1 {
        vec![Dim::Known(1), x[0].clone()]
    } else {
        x.clone()
    };
    let w2 = if w.len() == 1 {
        vec![w[0].clone(), Dim::Known(1)]
    } else {
        w.clone()
    };
    let mut out = broadcast(&x2[..x2.len() - 2], &w2[..w2.len() - 2])?;
    if x.len() > 1 {
        out.push(x2[x2.len() - 2].clone());
    }
    if w.len() > 1 {
        out.push(w2[w2.len() - 1].clone());
    }
    Some(out)
}

/// [M, N] from A and B, either transposed.
fn gemm(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let (x, w) = (a.input(0)?, a.input(1)?);
    if x.len() != 2 || w.len() != 2 {
        return None;
    }
    let m = if attr_i(a.node, "transA").unwrap_or(0) != 0 {
        &x[1]
    } else {
        &x[0]
    };
    let n = if attr_i(a.node, "transB").unwrap_or(0) != 0 {
        &w[0]
    } else {
        &w[1]
    };
    Some(vec![m.clone(), n.clone()])
}
