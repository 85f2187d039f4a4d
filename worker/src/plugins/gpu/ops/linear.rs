//! MatMul (numpy semantics, batched with broadcasting) and Gemm.

use tessera_common::declined::{invalid, unsupported, Declined};
use tessera_common::onnx::proto::NodeProto;

use super::elementwise::broadcast;
use super::{attr_f, attr_i, input, padded, unknown_attrs};
use crate::plugins::gpu::builder::Builder;

/// Batch dimensions a kernel launch takes.
const MAX_BATCH_RANK: usize = 4;

pub fn check(node: &NodeProto) -> Result<(), Declined> {
    match node.op_type() {
        "MatMul" => unknown_attrs(node, &[]),
        _ => unknown_attrs(node, &["alpha", "beta", "transA", "transB"]),
    }
}

pub fn plan(b: &mut Builder, node: &NodeProto) -> Result<(), Declined> {
    if node.op_type() == "Gemm" {
        return gemm(b, node);
    }
    let (x, w) = (
        input(node, 0).ok_or_else(|| invalid("no input A"))?,
        input(node, 1).ok_or_else(|| invalid("no input B"))?,
    );
    let (mut sa, mut sb) = (b.shape(x)?, b.shape(w)?);
    if sa.is_empty() || sb.is_empty() {
        return Err(invalid("MatMul of a scalar"));
    }
    // 1-D operands: a row (A) or a column (B), removed from the result.
    let (a_vec, b_vec) = (sa.len() == 1, sb.len() == 1);
    if a_vec {
        sa.insert(0, 1);
    }
    if b_vec {
        sb.push(1);
    }
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    if k != k2 {
        return Err(invalid(format!("inner dimensions differ: {sa:?} x {sb:?}")));
    }
    let (ba, bb) = (&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
    let batch = broadcast(ba, bb)?;
    if batch.len() > MAX_BATCH_RANK {
        return Err(unsupported(format!(
            "more than {MAX_BATCH_RANK} batch dimensions"
        )));
    }
    let mut out: Vec<usize> = batch.clone();
    if !a_vec {
        out.push(m);
    }
    if !b_vec {
        out.push(n);
    }
    let batch_strides = |own: &[usize], size: usize| -> Vec<u32> {
        let off = batch.len() - own.len();
        let mut stride = size;
        let mut s = vec![0u32; batch.len()];
        for i in (0..batch.len()).rev() {
            if i >= off && own[i - off] != 1 {
                s[i] = stride as u32;
            }
            if i >= off {
                stride *= own[i - off];
            }
        }
        s
    };
    let a_str = batch_strides(ba, m * k);
    let b_str = batch_strides(bb, k * n);
    let count: usize = batch.iter().product();
    let (xs, ws) = (b.slot(x)?, b.slot(w)?);
    let ys = b.output(&node.output[0], out)?;
    launch(
        b,
        [xs, ws, ws, ys],
        (m, n, k),
        (0, 0),
        (1.0, 0.0),
        None,
        &batch,
        &a_str,
        &b_str,
        count,
    )
}

fn gemm(b: &mut Builder, node: &NodeProto) -> Result<(), Declined> {
    let (x, w) = (
        input(node, 0).ok_or_else(|| invalid("no input A"))?,
        input(node, 1).ok_or_else(|| invalid("no input B"))?,
    );
    let (sa, sb) = (b.shape(x)?, b.shape(w)?);
    if sa.len() != 2 || sb.len() != 2 {
        return Err(invalid("Gemm takes 2-D A and B"));
    }
    let ta = attr_i(node, "transA").unwrap_or(0) != 0;
    let tb = attr_i(node, "transB").unwrap_or(0) != 0;
    let (m, k) = if ta { (sa[1], sa[0]) } else { (sa[0], sa[1]) };
    let (k2, n) = if tb { (sb[1], sb[0]) } else { (sb[0], sb[1]) };
    if k != k2 {
        return Err(invalid(format!("inner dimensions differ: {sa:?} x {sb:?}")));
    }
    let alpha = attr_f(node, "alpha").unwrap_or(1.0);
    let beta = attr_f(node, "beta").unwrap_or(1.0);
    let (xs, ws) = (b.slot(x)?, b.slot(w)?);
    let c = match input(node, 2) {
        Some(c) => {
            let sc = b.shape(c)?;
            let full = broadcast(&sc, &[m, n])?;
            if full != [m, n] {
                return Err(invalid(format!(
                    "C {sc:?} does not broadcast to [{m}, {n}]"
                )));
            }
            // Strides of C's (row, column) as broadcast to [M, N].
            let (rows, cols) = match sc.len() {
                0 => (1, 1),
                1 => (1, sc[0]),
                _ => (sc[0], sc[1]),
            };
            let sm = if rows == 1 { 0 } else { cols };
            let sn = if cols == 1 { 0 } else { 1 };
            Some((b.slot(c)?, sm as u32, sn as u32))
        }
        None => None,
    };
    let ys = b.output(&node.output[0], vec![m, n])?;
    let cs = c.map_or(ws, |c| c.0);
    let strides = c.map(|c| (c.1, c.2));
    launch(
        b,
        [xs, ws, cs, ys],
        (m, n, k),
        (ta as u32, tb as u32),
        (alpha, beta),
        strides,
        &[],
        &[],
        &[],
        1,
    )
}

#[allow(clippy::too_many_arguments)]
fn launch(
    b: &mut Builder,
    slots: [usize; 4],
    (m, n, k): (usize, usize, usize),
    (ta, tb): (u32, u32),
    (alpha, beta): (f32, f32),
    c: Option<(u32, u32)>,
    batch: &[usize],
    a_str: &[u32],
    b_str: &[u32],
    count: usize,
) -> Result<(), Declined> {
    if count > 65535 {
        return Err(unsupported(format!("{count} batches exceed one launch")));
    }
    let mut params = vec![
        m as u32,
        n as u32,
        k as u32,
        ta,
        tb,
        alpha.to_bits(),
        beta.to_bits(),
        c.is_some() as u32,
        c.map_or(0, |c| c.0),
        c.map_or(0, |c| c.1),
        batch.len() as u32,
    ];
    params.extend(padded(
        &batch.iter().map(|&d| d as u32).collect::<Vec<_>>(),
        MAX_BATCH_RANK,
        1,
    ));
    params.extend(padded(a_str, MAX_BATCH_RANK, 0));
    params.extend(padded(b_str, MAX_BATCH_RANK, 0));
    let groups = (
        n.div_ceil(64).max(1) as u32,
        m.div_ceil(64).max(1) as u32,
        count.max(1) as u32,
    );
    if groups.0 > 65535 || groups.1 > 65535 {
        return Err(unsupported(format!("a {m}x{n} result exceeds one launch")));
    }
    b.dispatch("gemm", &slots, &params, groups)
}
