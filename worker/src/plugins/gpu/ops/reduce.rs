//! Reductions (ReduceSum, ReduceMean, ReduceMax, ReduceMin over any axes)
//! and LayerNormalization.

use tessera_common::declined::{invalid, unknown, unsupported, Declined};
use tessera_common::onnx::proto::NodeProto;

use super::codes::UnaryOp;
use super::{attr_f, attr_i, attr_ints, axis, input, padded, strides, unknown_attrs, MAX_RANK};
use crate::plugins::gpu::builder::{groups_1d, Builder};

pub fn check(node: &NodeProto) -> Result<(), Declined> {
    match node.op_type() {
        "LayerNormalization" => {
            if attr_i(node, "stash_type").unwrap_or(1) != 1 {
                return Err(unsupported("stash_type other than float"));
            }
            unknown_attrs(node, &["axis", "epsilon", "stash_type"])
        }
        _ => unknown_attrs(node, &["axes", "keepdims", "noop_with_empty_axes"]),
    }
}

pub fn plan(b: &mut Builder, node: &NodeProto) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let sx = b.shape(x)?;
    let rank = sx.len();
    if node.op_type() == "LayerNormalization" {
        return layer_norm(b, node, x, sx);
    }
    let mode = match node.op_type() {
        "ReduceSum" => 0,
        "ReduceMean" => 1,
        "ReduceMax" => 2,
        _ => 3,
    };
    // Axes: an input from opset 13 (ReduceSum) or 18 (the others).
    let axes = match input(node, 1) {
        Some(name) => Some(
            b.ints(name)
                .ok_or_else(|| unknown("axes must be a constant"))?,
        ),
        None => attr_ints(node, "axes").map(<[i64]>::to_vec),
    };
    let axes: Vec<usize> = match axes {
        Some(a) if !a.is_empty() => a.iter().map(|&v| axis(v, rank)).collect::<Result<_, _>>()?,
        _ if attr_i(node, "noop_with_empty_axes").unwrap_or(0) != 0 => {
            let ys = b.output(&node.output[0], sx.clone())?;
            let xs = b.slot(x)?;
            let n: usize = sx.iter().product();
            return b.dispatch(
                "unary",
                &[xs, ys],
                &[n as u32, UnaryOp::Identity.code(), 0, 0],
                groups_1d(n),
            );
        }
        _ => (0..rank).collect(),
    };
    if rank > MAX_RANK {
        return Err(unsupported(format!("rank {rank} above {MAX_RANK}")));
    }
    if axes.iter().any(|&a| sx[a] == 0) {
        return Err(unsupported("a reduction over an empty axis"));
    }
    let keep = attr_i(node, "keepdims").unwrap_or(1) != 0;
    let kept: Vec<usize> = (0..rank)
        .map(|i| if axes.contains(&i) { 1 } else { sx[i] })
        .collect();
    let red: Vec<usize> = (0..rank)
        .map(|i| if axes.contains(&i) { sx[i] } else { 1 })
        .collect();
    let out: Vec<usize> = if keep {
        kept.clone()
    } else {
        (0..rank)
            .filter(|i| !axes.contains(i))
            .map(|i| sx[i])
            .collect()
    };
    let n: usize = kept.iter().product();
    let count: usize = red.iter().product();
    let to_u32 = |v: &[usize]| v.iter().map(|&d| d as u32).collect::<Vec<_>>();
    let mut params = vec![n as u32, rank as u32, mode, count as u32];
    params.extend(padded(&to_u32(&kept), MAX_RANK, 1));
    params.extend(padded(&to_u32(&strides(&sx)), MAX_RANK, 0));
    params.extend(padded(&to_u32(&red), MAX_RANK, 1));
    let xs = b.slot(x)?;
    let ys = b.output(&node.output[0], out)?;
    b.dispatch("reduce", &[xs, ys], &params, groups_1d(n))
}

/// LayerNormalization over the axes from `axis` on: one row per workgroup
/// thread, with its Mean and InvStdDev outputs (kept internal when not
/// asked for).
fn layer_norm(b: &mut Builder, node: &NodeProto, x: &str, sx: Vec<usize>) -> Result<(), Declined> {
    let rank = sx.len();
    let a = axis(attr_i(node, "axis").unwrap_or(-1), rank)?;
    let len: usize = sx[a..].iter().product();
    let rows: usize = sx[..a].iter().product();
    let scale = input(node, 1).ok_or_else(|| invalid("no scale"))?;
    if b.shape(scale)?.iter().product::<usize>() != len {
        return Err(invalid("scale does not match the normalized axes"));
    }
    let (bias, has_bias) = match input(node, 2) {
        Some(bias) if b.shape(bias)?.iter().product::<usize>() == len => (Some(bias), 1),
        Some(_) => return Err(invalid("bias does not match the normalized axes")),
        None => (None, 0),
    };
    let xs = b.slot(x)?;
    let ss = b.slot(scale)?;
    let bs = match bias {
        Some(bias) => b.slot(bias)?,
        None => ss,
    };
    let ys = b.output(&node.output[0], sx.clone())?;
    // Mean and InvStdDev: the input's shape with the normalized axes
    // set to 1 (kept internal when not asked for).
    let stats: Vec<usize> = (0..rank).map(|i| if i < a { sx[i] } else { 1 }).collect();
    let mut extra = Vec::new();
    for (i, what) in [(1, "mean"), (2, "inv_std_dev")] {
        let name = match node.output.get(i).filter(|o| !o.is_empty()) {
            Some(o) => o.clone(),
            None => format!("{}::{what}", node.name()),
        };
        extra.push(b.output(&name, stats.clone())?);
    }
    let eps = attr_f(node, "epsilon").unwrap_or(1e-5);
    let params = [rows as u32, len as u32, eps.to_bits(), has_bias];
    let groups = (rows.div_ceil(64).clamp(1, 65535) as u32, 1, 1);
    let slots = [xs, ss, bs, ys, extra[0], extra[1]];
    b.dispatch("layernorm", &slots, &params, groups)
}
