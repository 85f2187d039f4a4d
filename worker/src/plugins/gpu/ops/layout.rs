//! Layout ops: views (Reshape, Flatten, Squeeze, Unsqueeze: no copy),
//! strided copies (Transpose, Concat, Slice, Split, Expand), Softmax /
//! LogSoftmax along an axis, and Cast between f32 and f16.

use tessera_common::declined::{invalid, unknown, unsupported, Declined};
use tessera_common::onnx::proto::NodeProto;
use tessera_common::onnx::ElemType;

use super::elementwise::{broadcast, broadcast_strides};
use super::{attr_i, attr_ints, axis, input, padded, strides, unknown_attrs, MAX_RANK};
use crate::plugins::gpu::builder::{groups_1d, Builder};

pub fn check(node: &NodeProto, opset: i64) -> Result<(), Declined> {
    match node.op_type() {
        "Softmax" | "LogSoftmax" | "Flatten" | "Concat" => unknown_attrs(node, &["axis"]),
        "Reshape" => {
            if attr_i(node, "allowzero").unwrap_or(0) != 0 {
                return Err(unsupported("allowzero"));
            }
            unknown_attrs(node, &["allowzero"])
        }
        "Squeeze" | "Unsqueeze" => unknown_attrs(node, &["axes"]),
        "Transpose" => unknown_attrs(node, &["perm"]),
        "Slice" if opset < 10 => unknown_attrs(node, &["starts", "ends", "axes"]),
        "Slice" | "Expand" => unknown_attrs(node, &[]),
        "Split" => unknown_attrs(node, &["axis", "split", "num_outputs"]),
        // saturate only matters for float8 targets.
        "Cast" => cast_target(node).and_then(|_| unknown_attrs(node, &["to", "saturate"])),
        other => Err(unsupported(format!("{other} is not a layout op"))),
    }
}

/// Softmax rows from this long are reduced by a workgroup each (shorter
/// ones by a thread each).
const ROW_PARALLEL_SOFTMAX: usize = 256;

/// Cast's target: float or float16.
pub fn cast_target(node: &NodeProto) -> Result<ElemType, Declined> {
    match attr_i(node, "to").map(|t| ElemType(t as i32)) {
        Some(e) if e == ElemType::FLOAT || e == ElemType::FLOAT16 => Ok(e),
        Some(e) => Err(unsupported(format!("Cast to {}", e.name()))),
        None => Err(invalid("Cast without 'to'")),
    }
}

/// Cast (`b.elem` is its target): a view where the type does not change,
/// else a conversion kernel.
fn cast(b: &mut Builder, x: &str, out: &str, shape: Vec<usize>) -> Result<(), Declined> {
    let from = b
        .elem_of(x)
        .ok_or_else(|| unknown("an input without a buffer"))?;
    if from == b.elem {
        return b.alias(out, x, shape);
    }
    let n: usize = shape.iter().product();
    let xs = b.slot(x)?;
    let ys = b.output(out, shape)?;
    let kernel = if b.elem == ElemType::FLOAT16 {
        "cast_to_half"
    } else {
        "cast_to_float"
    };
    b.dispatch(kernel, &[xs, ys], &[n as u32], groups_1d(n))
}

/// Values of constant input `i`, or of attribute `attr` (older opsets).
fn ints_of(
    b: &Builder,
    node: &NodeProto,
    i: usize,
    attr: &str,
) -> Result<Option<Vec<i64>>, Declined> {
    match input(node, i) {
        Some(name) => b
            .ints(name)
            .map(Some)
            .ok_or_else(|| unknown(format!("input '{name}' must be a constant"))),
        None => Ok(attr_ints(node, attr).map(<[i64]>::to_vec)),
    }
}

/// A strided copy: for every index of `dims`, dst[dst_off + c·dst] =
/// src[src_off + c·src].
#[allow(clippy::too_many_arguments)]
fn copy(
    b: &mut Builder,
    from: usize,
    to: usize,
    dims: &[usize],
    src: &[i64],
    src_off: i64,
    dst: &[usize],
    dst_off: usize,
) -> Result<(), Declined> {
    if dims.len() > MAX_RANK {
        return Err(unsupported(format!("rank {} above {MAX_RANK}", dims.len())));
    }
    let n: usize = dims.iter().product();
    if n == 0 {
        return Ok(());
    }
    let mut p = vec![n as u32, dims.len() as u32, src_off as u32, dst_off as u32];
    p.extend(padded(
        &dims.iter().map(|&d| d as u32).collect::<Vec<_>>(),
        MAX_RANK,
        1,
    ));
    p.extend(padded(
        &src.iter().map(|&s| s as i32 as u32).collect::<Vec<_>>(),
        MAX_RANK,
        0,
    ));
    p.extend(padded(
        &dst.iter().map(|&s| s as u32).collect::<Vec<_>>(),
        MAX_RANK,
        0,
    ));
    b.dispatch("copy", &[from, to], &p, groups_1d(n))
}

fn signed(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

/// What every layout op reads: the node, input 0 and its shape, output 0.
struct Op<'n> {
    node: &'n NodeProto,
    x: &'n str,
    sx: Vec<usize>,
    out: String,
}

pub fn plan(b: &mut Builder, node: &NodeProto) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let op = Op {
        node,
        x,
        sx: b.shape(x)?,
        out: node
            .output
            .first()
            .ok_or_else(|| invalid("no output"))?
            .clone(),
    };
    match node.op_type() {
        "Cast" => cast(b, op.x, &op.out, op.sx),
        "Reshape" => reshape(b, op),
        "Flatten" => flatten(b, op),
        "Squeeze" => squeeze(b, op),
        "Unsqueeze" => unsqueeze(b, op),
        "Transpose" => transpose(b, op),
        "Expand" => expand(b, op),
        "Concat" => concat(b, op),
        "Slice" => slice(b, op),
        "Split" => split(b, op),
        _ => softmax(b, op),
    }
}

/// A view with the target shape (0 copies the input's dim, one -1 is inferred).
fn reshape(b: &mut Builder, op: Op) -> Result<(), Declined> {
    let sx = &op.sx;
    let want = ints_of(b, op.node, 1, "shape")?.ok_or_else(|| invalid("no shape"))?;
    let total: usize = op.sx.iter().product();
    let mut shape = Vec::new();
    let mut infer = None;
    for (i, &d) in want.iter().enumerate() {
        match d {
            0 => shape.push(
                *op.sx
                    .get(i)
                    .ok_or_else(|| invalid("0 beyond the input's rank"))?,
            ),
            -1 if infer.is_none() => {
                infer = Some(i);
                shape.push(1);
            }
            d if d > 0 => shape.push(d as usize),
            _ => return Err(invalid(format!("bad shape {want:?}"))),
        }
    }
    let known: usize = shape.iter().product();
    if let Some(i) = infer {
        if known == 0 || total % known != 0 {
            return Err(invalid(format!("cannot reshape {sx:?} to {want:?}")));
        }
        shape[i] = total / known;
    }
    if shape.iter().product::<usize>() != total {
        return Err(invalid(format!("cannot reshape {sx:?} to {want:?}")));
    }
    b.alias(&op.out, op.x, shape)
}

/// A 2-D view split at the axis.
fn flatten(b: &mut Builder, op: Op) -> Result<(), Declined> {
    let rank = op.sx.len();
    let a = attr_i(op.node, "axis").unwrap_or(1);
    let a = if a < 0 { a + rank as i64 } else { a };
    if a < 0 || a as usize > rank {
        return Err(invalid(format!("axis {a} out of range")));
    }
    let outer: usize = op.sx[..a as usize].iter().product();
    let inner: usize = op.sx[a as usize..].iter().product();
    b.alias(&op.out, op.x, vec![outer, inner])
}

/// A view without the given axes of 1 (every axis of 1 without axes).
fn squeeze(b: &mut Builder, op: Op) -> Result<(), Declined> {
    let rank = op.sx.len();
    let axes = match ints_of(b, op.node, 1, "axes")? {
        Some(a) => a
            .iter()
            .map(|&a| axis(a, rank))
            .collect::<Result<Vec<_>, _>>()?,
        None => (0..rank).filter(|&i| op.sx[i] == 1).collect(),
    };
    if axes.iter().any(|&a| op.sx[a] != 1) {
        return Err(invalid("squeezing an axis that is not 1"));
    }
    let shape = (0..rank)
        .filter(|i| !axes.contains(i))
        .map(|i| op.sx[i])
        .collect();
    b.alias(&op.out, op.x, shape)
}

/// A view with axes of 1 inserted.
fn unsqueeze(b: &mut Builder, op: Op) -> Result<(), Declined> {
    let rank = op.sx.len();
    let axes = ints_of(b, op.node, 1, "axes")?.ok_or_else(|| invalid("no axes"))?;
    let out_rank = rank + axes.len();
    let axes: Vec<usize> = axes
        .iter()
        .map(|&a| axis(a, out_rank))
        .collect::<Result<_, _>>()?;
    let mut rest = op.sx.iter();
    let shape = (0..out_rank)
        .map(|i| {
            if axes.contains(&i) {
                1
            } else {
                *rest.next().unwrap_or(&1)
            }
        })
        .collect();
    b.alias(&op.out, op.x, shape)
}

/// A strided copy in the permuted order.
fn transpose(b: &mut Builder, op: Op) -> Result<(), Declined> {
    let rank = op.sx.len();
    let perm: Vec<usize> = match attr_ints(op.node, "perm") {
        Some(p) => p.iter().map(|&a| axis(a, rank)).collect::<Result<_, _>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut seen = perm.clone();
    seen.sort_unstable();
    if seen != (0..rank).collect::<Vec<_>>() {
        return Err(invalid(format!("bad perm {perm:?}")));
    }
    let out: Vec<usize> = perm.iter().map(|&p| op.sx[p]).collect();
    let st = strides(&op.sx);
    let src: Vec<i64> = perm.iter().map(|&p| st[p] as i64).collect();
    let (xs, ys) = (b.slot(op.x)?, b.output(&op.out, out.clone())?);
    copy(b, xs, ys, &out, &src, 0, &strides(&out), 0)
}

/// A strided copy broadcast to the target shape.
fn expand(b: &mut Builder, op: Op) -> Result<(), Declined> {
    let want = ints_of(b, op.node, 1, "shape")?.ok_or_else(|| invalid("no shape"))?;
    if want.iter().any(|&d| d < 0) {
        return Err(invalid("negative dimension"));
    }
    let want: Vec<usize> = want.iter().map(|&d| d as usize).collect();
    let out = broadcast(&op.sx, &want)?;
    let src: Vec<i64> = broadcast_strides(&op.sx, &out)
        .iter()
        .map(|&s| s as i64)
        .collect();
    let (xs, ys) = (b.slot(op.x)?, b.output(&op.out, out.clone())?);
    copy(b, xs, ys, &out, &src, 0, &strides(&out), 0)
}

/// Each input copied into its place along the axis.
fn concat(b: &mut Builder, op: Op) -> Result<(), Declined> {
    let sx = &op.sx;
    let rank = op.sx.len();
    let a = axis(
        attr_i(op.node, "axis").ok_or_else(|| invalid("no axis"))?,
        rank,
    )?;
    let mut out = op.sx.clone();
    out[a] = 0;
    let mut parts = Vec::new();
    for name in op.node.input.iter().filter(|n| !n.is_empty()) {
        let s = b.shape(name)?;
        if s.len() != rank || (0..rank).any(|i| i != a && s[i] != op.sx[i]) {
            return Err(invalid(format!(
                "'{name}' {s:?} does not concatenate with {sx:?}"
            )));
        }
        out[a] += s[a];
        parts.push((name.clone(), s));
    }
    let ys = b.output(&op.out, out.clone())?;
    let dst = strides(&out);
    let mut offset = 0;
    for (name, s) in parts {
        let xs = b.slot(&name)?;
        copy(
            b,
            xs,
            ys,
            &s,
            &signed(&strides(&s)),
            0,
            &dst,
            offset * dst[a],
        )?;
        offset += s[a];
    }
    Ok(())
}

/// A strided copy of the selected range along each axis.
fn slice(b: &mut Builder, op: Op) -> Result<(), Declined> {
    let rank = op.sx.len();
    let starts = ints_of(b, op.node, 1, "starts")?.ok_or_else(|| invalid("no starts"))?;
    let ends = ints_of(b, op.node, 2, "ends")?.ok_or_else(|| invalid("no ends"))?;
    let axes =
        ints_of(b, op.node, 3, "axes")?.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = ints_of(b, op.node, 4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(invalid("starts, ends, axes and steps differ in length"));
    }
    let st = strides(&op.sx);
    let mut out = op.sx.clone();
    let mut src: Vec<i64> = signed(&st);
    let mut off = 0i64;
    for i in 0..starts.len() {
        let a = axis(axes[i], rank)?;
        let dim = op.sx[a] as i64;
        let step = steps[i];
        if step == 0 {
            return Err(invalid("step 0"));
        }
        let clamp = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
        let norm = |v: i64| if v < 0 { v + dim } else { v };
        let (start, end) = if step > 0 {
            (clamp(norm(starts[i]), 0, dim), clamp(norm(ends[i]), 0, dim))
        } else {
            (
                clamp(norm(starts[i]), -1, dim - 1),
                clamp(norm(ends[i]), -1, dim - 1),
            )
        };
        let len = if step > 0 {
            ((end - start).max(0) + step - 1) / step
        } else {
            ((start - end).max(0) + (-step) - 1) / (-step)
        };
        out[a] = len as usize;
        off += start.max(0) * st[a] as i64;
        src[a] = st[a] as i64 * step;
    }
    let (xs, ys) = (b.slot(op.x)?, b.output(&op.out, out.clone())?);
    copy(b, xs, ys, &out, &src, off, &strides(&out), 0)
}

/// Each output a strided copy of its range along the axis.
fn split(b: &mut Builder, op: Op) -> Result<(), Declined> {
    let rank = op.sx.len();
    let a = axis(attr_i(op.node, "axis").unwrap_or(0), rank)?;
    let outputs: Vec<&String> = op.node.output.iter().collect();
    let sizes: Vec<usize> = match ints_of(b, op.node, 1, "split")? {
        Some(s) => s.iter().map(|&v| v.max(0) as usize).collect(),
        None => {
            let k = outputs.len();
            let each = op.sx[a].div_ceil(k);
            (0..k)
                .map(|i| each.min(op.sx[a].saturating_sub(i * each)))
                .collect()
        }
    };
    if sizes.len() != outputs.len() || sizes.iter().sum::<usize>() != op.sx[a] {
        return Err(invalid(format!(
            "split {sizes:?} does not fit {}",
            op.sx[a]
        )));
    }
    let st = strides(&op.sx);
    let xs = b.slot(op.x)?;
    let mut offset = 0;
    for (name, size) in outputs.into_iter().zip(sizes) {
        let mut out = op.sx.clone();
        out[a] = size;
        let ys = b.output(name, out.clone())?;
        copy(
            b,
            xs,
            ys,
            &out,
            &signed(&st),
            (offset * st[a]) as i64,
            &strides(&out),
            0,
        )?;
        offset += size;
    }
    Ok(())
}

/// Softmax / LogSoftmax along the axis: a thread per row, or a workgroup
/// per long row.
fn softmax(b: &mut Builder, op: Op) -> Result<(), Declined> {
    let rank = op.sx.len();
    // Softmax / LogSoftmax.
    let default = if b.opset >= 13 { -1 } else { 1 };
    let a = axis(attr_i(op.node, "axis").unwrap_or(default), rank)?;
    let (outer, len, inner) = if b.opset >= 13 {
        (
            op.sx[..a].iter().product::<usize>(),
            op.sx[a],
            op.sx[a + 1..].iter().product::<usize>(),
        )
    } else {
        // Before opset 13: coerced to 2-D at the axis.
        (op.sx[..a].iter().product(), op.sx[a..].iter().product(), 1)
    };
    let log = (op.node.op_type() == "LogSoftmax") as usize;
    let (xs, ys) = (b.slot(op.x)?, b.output(&op.out, op.sx)?);
    let params = [outer, len, inner, log].map(|v| v as u32);
    let rows = outer * inner;
    if len >= ROW_PARALLEL_SOFTMAX {
        // Long rows: a workgroup per row.
        let groups = (rows.clamp(1, 65535) as u32, 1, 1);
        return b.dispatch("softmax_rows", &[xs, ys], &params, groups);
    }
    b.dispatch("softmax", &[xs, ys], &params, groups_1d(rows))
}
