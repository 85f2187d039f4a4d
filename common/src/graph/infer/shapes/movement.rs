//! Ops that move, select or reshape data: their output dims come from the
//! input's and from attributes or constant inputs.

use super::{broadcast, norm_axis, rank, repeated, Rule, ShapeArgs};
use crate::graph::Dim;
use crate::onnx::attr::{attr_i, attr_ints};

pub(super) const RULES: &[(&str, Rule)] = &[
    ("Transpose", Rule::First(transpose)),
    ("Flatten", Rule::First(flatten)),
    ("Reshape", Rule::First(reshape)),
    ("Concat", Rule::First(concat)),
    // Every output: the input's shape with the split axis unknown.
    ("Split", Rule::All(|a| repeated(split(a), a.outputs()))),
    ("Slice", Rule::First(slice)),
    ("Expand", Rule::First(expand)),
    ("Gather", Rule::First(gather)),
    ("Unsqueeze", Rule::First(unsqueeze)),
    ("Squeeze", Rule::First(squeeze)),
    ("Resize", SAME_RANK),
    ("Pad", SAME_RANK),
    ("Tile", SAME_RANK),
    ("ConvTranspose", SAME_RANK),
    ("DepthToSpace", SAME_RANK),
    ("SpaceToDepth", SAME_RANK),
    ("Upsample", SAME_RANK),
    ("ReverseSequence", SAME_RANK),
    ("CumSum", SAME_RANK),
    ("Trilu", SAME_RANK),
    ("GridSample", SAME_RANK),
];

/// Rank-preserving; dims are not derived.
const SAME_RANK: Rule = Rule::First(|a| Some(vec![Dim::Unknown; a.input(0)?.len()]));

fn transpose(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let x = a.input(0)?;
    let perm = attr_ints(a.node, "perm")
        .map(<[i64]>::to_vec)
        .unwrap_or_else(|| (0..x.len() as i64).rev().collect());
    perm.iter()
        .map(|&p| x.get(usize::try_from(p).ok()?).cloned())
        .collect()
}

fn flatten(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let x = a.input(0)?;
    let axis = norm_axis(attr_i(a.node, "axis").unwrap_or(1), x.len())?;
    let prod = |d: &[Dim]| {
        crate::graph::numel(d)
            .map(|v| Dim::Known(v as i64))
            .unwrap_or(Dim::Unknown)
    };
    Some(vec![prod(&x[..axis]), prod(&x[axis..])])
}

/// The target shape (0 copies the input's dim unless allowzero; one -1
/// is inferred from the element count where known).
fn reshape(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let Some(target) = a.ints(1) else {
        // Rank from the length of the shape operand.
        let len = a.input(1)?.first()?.known()?;
        return Some(vec![Dim::Unknown; rank(len)?]);
    };
    let x = a.input(0);
    let allow_zero = attr_i(a.node, "allowzero").unwrap_or(0) != 0;
    let mut out: Vec<Dim> = target
        .iter()
        .enumerate()
        .map(|(i, &v)| match v {
            0 if !allow_zero => x
                .as_ref()
                .and_then(|x| x.get(i).cloned())
                .unwrap_or(Dim::Unknown),
            -1 => Dim::Unknown,
            v => Dim::Known(v),
        })
        .collect();
    if let Some(pos) = target.iter().position(|&v| v == -1) {
        let total = x.as_deref().and_then(crate::graph::numel);
        let known: Option<u64> = out
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != pos)
            .try_fold(1u64, |acc, (_, d)| {
                acc.checked_mul(u64::try_from(d.known()?).ok()?)
            });
        if let Some(v) = total.zip(known).and_then(|(t, k)| t.checked_div(k)) {
            out[pos] = Dim::Known(i64::try_from(v).unwrap_or(i64::MAX));
        }
    }
    Some(out)
}

fn concat(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let first = a.input(0)?;
    let axis = norm_axis(attr_i(a.node, "axis")?, first.len())?;
    let mut total = Some(0i64);
    for k in 0..a.node.input.len() {
        let s = a.input(k)?;
        total = total.and_then(|t| t.checked_add(s.get(axis)?.known()?));
    }
    let mut out = first;
    *out.get_mut(axis)? = total.map(Dim::Known).unwrap_or(Dim::Unknown);
    Some(out)
}

fn split(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let mut x = a.input(0)?;
    let axis = norm_axis(attr_i(a.node, "axis").unwrap_or(0), x.len())?;
    *x.get_mut(axis)? = Dim::Unknown;
    Some(x)
}

/// Slice's starts, ends, axes and steps: from constant inputs (opset 10+)
/// or attributes (opset 1).
fn slice_params(a: &ShapeArgs) -> [Option<Vec<i64>>; 4] {
    if a.node.input.len() > 1 {
        let starts = a.ints(1);
        let ends = a.ints(2);
        let axes = if a.has_input(3) {
            a.ints(3)
        } else {
            starts.as_ref().map(|s| (0..s.len() as i64).collect())
        };
        let steps = if a.has_input(4) {
            a.ints(4)
        } else {
            starts.as_ref().map(|s| vec![1; s.len()])
        };
        return [starts, ends, axes, steps];
    }
    let starts = attr_ints(a.node, "starts").map(<[i64]>::to_vec);
    let axes = attr_ints(a.node, "axes")
        .map(<[i64]>::to_vec)
        .or_else(|| starts.as_ref().map(|s| (0..s.len() as i64).collect()));
    [
        starts.clone(),
        attr_ints(a.node, "ends").map(<[i64]>::to_vec),
        axes,
        starts.map(|s| vec![1; s.len()]),
    ]
}

fn slice(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let x = a.input(0)?;
    let rank = x.len() as i64;
    let [Some(starts), Some(ends), Some(axes), Some(steps)] = slice_params(a) else {
        return Some(vec![Dim::Unknown; x.len()]);
    };
    let mut out = x;
    for (k, &axis) in axes.iter().enumerate() {
        let axis = if axis < 0 { axis + rank } else { axis };
        let (Some(&start), Some(&end), Some(&step)) = (starts.get(k), ends.get(k), steps.get(k))
        else {
            return None;
        };
        let slot = out.get_mut(usize::try_from(axis).ok()?)?;
        *slot = match slot.known() {
            Some(d) => Dim::Known(sliced_len(d, start, end, step)?),
            None => Dim::Unknown,
        };
    }
    Some(out)
}

/// How many elements `start:end:step` selects from a dim of `d`; `None`
/// for a step of 0.
fn sliced_len(d: i64, start: i64, end: i64, step: i64) -> Option<i64> {
    let (d, step) = (d as i128, step as i128);
    let norm = |v: i64| if v < 0 { v as i128 + d } else { v as i128 };
    let len = if step > 0 {
        let (s, e) = (norm(start).clamp(0, d), norm(end).clamp(0, d));
        (e - s + step - 1).div_euclid(step).max(0)
    } else if step < 0 {
        let (s, e) = (norm(start).clamp(0, d - 1), norm(end).clamp(-1, d - 1));
        (s - e - step - 1).div_euclid(-step).max(0)
    } else {
        return None;
    };
    i64::try_from(len).ok()
}

/// Broadcast against the target shape; a target 1 may keep the input's
/// dim, so it stays unknown.
fn expand(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let x = a.input(0)?;
    match a.ints(1) {
        Some(target) => {
            let target: Vec<Dim> = target.into_iter().map(Dim::Known).collect();
            broadcast(&x, &target).map(|b| {
                b.into_iter()
                    .map(|d| if d == Dim::Known(1) { Dim::Unknown } else { d })
                    .collect()
            })
        }
        None => {
            let len = rank(a.input(1)?.first()?.known()?)?;
            Some(vec![Dim::Unknown; len.max(x.len())])
        }
    }
}

/// The data's dims with the axis replaced by the indices' dims.
fn gather(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let (x, idx) = (a.input(0)?, a.input(1)?);
    let axis = norm_axis(attr_i(a.node, "axis").unwrap_or(0), x.len())?;
    if axis >= x.len() {
        return None;
    }
    Some(
        x[..axis]
            .iter()
            .chain(&idx)
            .chain(&x[axis + 1..])
            .cloned()
            .collect(),
    )
}

/// Squeeze's and Unsqueeze's axes: an attribute (before opset 13) or a
/// constant input.
fn axes(a: &ShapeArgs) -> Option<Vec<i64>> {
    attr_ints(a.node, "axes")
        .map(<[i64]>::to_vec)
        .or_else(|| a.ints(1))
}

fn unsqueeze(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let x = a.input(0)?;
    let axes = axes(a)?;
    let rank = x.len() + axes.len();
    let axes: Vec<usize> = axes
        .into_iter()
        .map(|axis| norm_axis(axis, rank).unwrap_or(usize::MAX))
        .collect();
    let mut it = x.into_iter();
    (0..rank)
        .map(|i| {
            if axes.contains(&i) {
                Some(Dim::Known(1))
            } else {
                it.next()
            }
        })
        .collect()
}

/// Without axes, every dim of 1 goes: known only when every dim is.
fn squeeze(a: &ShapeArgs) -> Option<Vec<Dim>> {
    let x = a.input(0)?;
    match axes(a) {
        Some(axes) => {
            let axes: Vec<usize> = axes
                .into_iter()
                .map(|axis| norm_axis(axis, x.len()).unwrap_or(usize::MAX))
                .collect();
            Some(
                x.into_iter()
                    .enumerate()
                    .filter(|(i, _)| !axes.contains(i))
                    .map(|(_, d)| d)
                    .collect(),
            )
        }
        None if x.iter().all(|d| d.known().is_some()) => {
            Some(x.into_iter().filter(|d| *d != Dim::Known(1)).collect())
        }
        None => None,
    }
}
