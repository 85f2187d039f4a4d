//! Static-shape rules: the shape of output 0 of an op (of every output for
//! `Split` and `If`), where the rule can derive it.

use super::super::build::tensor_type;
use super::{attr, attr_i, attr_ints, Dim};
use crate::onnx::proto::NodeProto;

/// Shape of output `k` of an `If`: the branches' declared shape where they
/// agree, unknown dims where they differ, nothing if the ranks differ.
pub(super) fn if_output_shape(node: &NodeProto, k: usize) -> Option<Vec<Dim>> {
    let branch = |name: &str| {
        let g = attr(node, name)?.g.as_ref()?;
        tensor_type(g.output.get(k)?.r#type.as_ref()?).1
    };
    let (a, b) = (branch("then_branch")?, branch("else_branch")?);
    (a.len() == b.len()).then(|| {
        a.into_iter()
            .zip(b)
            .map(|(x, y)| if x == y { x } else { Dim::Unknown })
            .collect()
    })
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

/// Static shape of every output, where a rule knows it: output 0 from
/// [`output_shape`], the others from the rules of multi-output ops.
pub(super) fn output_shapes(
    node: &NodeProto,
    in_shape: &dyn Fn(usize) -> Option<Vec<Dim>>,
    const_ints: &dyn Fn(usize) -> Option<Vec<i64>>,
) -> Vec<Option<Vec<Dim>>> {
    let op = node.op_type.as_deref().unwrap_or("");
    let n = node.output.len();
    if matches!(op, "LSTM" | "GRU" | "RNN") {
        return recurrent_shapes(node, in_shape, n);
    }
    if op == "If" {
        return (0..n).map(|k| if_output_shape(node, k)).collect();
    }
    let first = output_shape(node, in_shape, const_ints);
    match op {
        // Every output like output 0 (Split: the split axis unknown).
        "Split" | "MaxPool" => (0..n).map(|_| first.clone()).collect(),
        "TopK" => {
            let s = topk_shape(node, in_shape, const_ints);
            vec![s; n]
        }
        "Dropout" => vec![first.clone(), in_shape(0)]
            .into_iter()
            .take(n)
            .collect(),
        "LayerNormalization" => {
            let stats = in_shape(0).and_then(|x| {
                let axis = norm_axis(attr_i(node, "axis").unwrap_or(-1), x.len())?;
                Some(
                    x.iter()
                        .enumerate()
                        .map(|(i, d)| if i < axis { d.clone() } else { Dim::Known(1) })
                        .collect::<Vec<_>>(),
                )
            });
            vec![first, stats.clone(), stats]
                .into_iter()
                .take(n)
                .collect()
        }
        _ => (0..n)
            .map(|k| if k == 0 { first.clone() } else { None })
            .collect(),
    }
}

/// LSTM / GRU / RNN: Y, Y_h (and Y_c) from X's shape, `hidden_size`,
/// `direction` and `layout`.
fn recurrent_shapes(
    node: &NodeProto,
    in_shape: &dyn Fn(usize) -> Option<Vec<Dim>>,
    n: usize,
) -> Vec<Option<Vec<Dim>>> {
    let Some(x) = in_shape(0).filter(|x| x.len() == 3) else {
        return vec![None; n];
    };
    let hidden = attr_i(node, "hidden_size").map_or(Dim::Unknown, Dim::Known);
    let dirs = match attr(node, "direction").and_then(|a| a.s.as_deref()) {
        Some(b"bidirectional") => Dim::Known(2),
        _ => Dim::Known(1),
    };
    let batch_first = attr_i(node, "layout").unwrap_or(0) != 0;
    let (seq, batch) = if batch_first {
        (x[1].clone(), x[0].clone())
    } else {
        (x[0].clone(), x[1].clone())
    };
    let (y, state) = if batch_first {
        (
            vec![batch.clone(), seq, dirs.clone(), hidden.clone()],
            vec![batch, dirs, hidden],
        )
    } else {
        (
            vec![seq, dirs.clone(), batch.clone(), hidden.clone()],
            vec![dirs, batch, hidden],
        )
    };
    (0..n)
        .map(|k| Some(if k == 0 { y.clone() } else { state.clone() }))
        .collect()
}

/// TopK's outputs: the input's shape with the axis dim `k`.
fn topk_shape(
    node: &NodeProto,
    in_shape: &dyn Fn(usize) -> Option<Vec<Dim>>,
    const_ints: &dyn Fn(usize) -> Option<Vec<i64>>,
) -> Option<Vec<Dim>> {
    let mut x = in_shape(0)?;
    let axis = norm_axis(attr_i(node, "axis").unwrap_or(-1), x.len())?;
    let k = attr_i(node, "k").or_else(|| const_ints(1)?.first().copied());
    *x.get_mut(axis)? = k.map_or(Dim::Unknown, Dim::Known);
    Some(x)
}

/// Static shape of output 0, where a rule knows it.
pub(super) fn output_shape(
    node: &NodeProto,
    in_shape: &dyn Fn(usize) -> Option<Vec<Dim>>,
    const_ints: &dyn Fn(usize) -> Option<Vec<i64>>,
) -> Option<Vec<Dim>> {
    let op = node.op_type.as_deref().unwrap_or("");
    match op {
        "Relu"
        | "LeakyRelu"
        | "Sigmoid"
        | "Tanh"
        | "Exp"
        | "Log"
        | "Sqrt"
        | "Neg"
        | "Abs"
        | "Cast"
        | "CastLike"
        | "Clip"
        | "HardSigmoid"
        | "HardSwish"
        | "Erf"
        | "Softmax"
        | "LogSoftmax"
        | "Identity"
        | "Dropout"
        | "BatchNormalization"
        | "LayerNormalization"
        | "InstanceNormalization"
        | "Gelu"
        | "Elu"
        | "Selu"
        | "Softplus"
        | "Floor"
        | "Ceil"
        | "Round"
        | "Reciprocal"
        | "Sin"
        | "Cos"
        | "Not"
        | "Sign"
        | "PRelu"
        | "IsNaN"
        | "IsInf"
        | "Mish"
        | "Softsign"
        | "LRN"
        | "QuantizeLinear"
        | "DequantizeLinear" => in_shape(0),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Equal" | "Less" | "Greater" | "LessOrEqual"
        | "GreaterOrEqual" | "And" | "Or" | "Xor" | "Mod" | "Max" | "Min" | "Sum" | "Mean"
        | "Where" => {
            let mut acc = in_shape(0)?;
            for k in 1..node.input.len() {
                acc = broadcast(&acc, &in_shape(k)?)?;
            }
            Some(acc)
        }
        "MatMul" => {
            let (a, b) = (in_shape(0)?, in_shape(1)?);
            if a.is_empty() || b.is_empty() {
                return None;
            }
            let (a2, b2) = (
                if a.len() == 1 {
                    vec![Dim::Known(1), a[0].clone()]
                } else {
                    a.clone()
                },
                if b.len() == 1 {
                    vec![b[0].clone(), Dim::Known(1)]
                } else {
                    b.clone()
                },
            );
            let mut out = broadcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
            if a.len() > 1 {
                out.push(a2[a2.len() - 2].clone());
            }
            if b.len() > 1 {
                out.push(b2[b2.len() - 1].clone());
            }
            Some(out)
        }
        "Gemm" => {
            let (a, b) = (in_shape(0)?, in_shape(1)?);
            if a.len() != 2 || b.len() != 2 {
                return None;
            }
            let m = if attr_i(node, "transA").unwrap_or(0) != 0 {
                &a[1]
            } else {
                &a[0]
            };
            let n = if attr_i(node, "transB").unwrap_or(0) != 0 {
                &b[0]
            } else {
                &b[1]
            };
            Some(vec![m.clone(), n.clone()])
        }
        "Conv" | "MaxPool" | "AveragePool" => {
            let x = in_shape(0)?;
            if x.len() < 3 {
                return None;
            }
            let spatial = x.len() - 2;
            let (channels, kernel) = if op == "Conv" {
                let w = in_shape(1)?;
                let kernel = attr_ints(node, "kernel_shape")
                    .map(<[i64]>::to_vec)
                    .unwrap_or_else(|| w.iter().skip(2).filter_map(Dim::known).collect());
                (w.first()?.clone(), kernel)
            } else {
                (
                    x[1].clone(),
                    attr_ints(node, "kernel_shape").map(<[i64]>::to_vec)?,
                )
            };
            if kernel.len() != spatial {
                return None;
            }
            let strides = attr_ints(node, "strides")
                .map(<[i64]>::to_vec)
                .filter(|v| !v.is_empty())
                .unwrap_or(vec![1; spatial]);
            let dilations = attr_ints(node, "dilations")
                .map(<[i64]>::to_vec)
                .filter(|v| !v.is_empty())
                .unwrap_or(vec![1; spatial]);
            let pads = attr_ints(node, "pads")
                .map(<[i64]>::to_vec)
                .filter(|v| !v.is_empty())
                .unwrap_or(vec![0; 2 * spatial]);
            let auto_pad = attr(node, "auto_pad")
                .and_then(|a| a.s.as_deref())
                .unwrap_or(b"NOTSET");
            let ceil = attr_i(node, "ceil_mode").unwrap_or(0) != 0;
            if strides.len() != spatial || dilations.len() != spatial || pads.len() != 2 * spatial {
                return None;
            }
            let mut out = vec![x[0].clone(), channels];
            for i in 0..spatial {
                let Some(input) = x[i + 2].known() else {
                    out.push(Dim::Unknown);
                    continue;
                };
                // i128 arithmetic: attributes come from the file and may be absurd.
                let w = |v: i64| v as i128;
                let eff = (w(kernel[i]) - 1) * w(dilations[i]) + 1;
                let s = w(strides[i]).max(1);
                let input = w(input);
                let v = match auto_pad {
                    b"SAME_UPPER" | b"SAME_LOWER" => (input + s - 1) / s,
                    b"VALID" => (input - eff) / s + 1,
                    _ => {
                        let span = input + w(pads[i]) + w(pads[i + spatial]) - eff;
                        if ceil {
                            (span + s - 1) / s + 1
                        } else {
                            span / s + 1
                        }
                    }
                };
                let Ok(v) = i64::try_from(v) else {
                    out.push(Dim::Unknown);
                    continue;
                };
                out.push(Dim::Known(v));
            }
            Some(out)
        }
        "GlobalAveragePool" | "GlobalMaxPool" => {
            let x = in_shape(0)?;
            Some(
                x.iter()
                    .enumerate()
                    .map(|(i, d)| if i < 2 { d.clone() } else { Dim::Known(1) })
                    .collect(),
            )
        }
        "Transpose" => {
            let x = in_shape(0)?;
            let perm = attr_ints(node, "perm")
                .map(<[i64]>::to_vec)
                .unwrap_or_else(|| (0..x.len() as i64).rev().collect());
            perm.iter()
                .map(|&p| x.get(usize::try_from(p).ok()?).cloned())
                .collect()
        }
        "Flatten" => {
            let x = in_shape(0)?;
            let axis = attr_i(node, "axis").unwrap_or(1);
            let axis = norm_axis(axis, x.len())?;
            let prod = |d: &[Dim]| {
                crate::graph::numel(d)
                    .map(|v| Dim::Known(v as i64))
                    .unwrap_or(Dim::Unknown)
            };
            Some(vec![prod(&x[..axis]), prod(&x[axis..])])
        }
        "Reshape" => {
            let Some(target) = const_ints(1) else {
                // Rank from the length of the shape operand.
                let len = in_shape(1)?.first()?.known()?;
                return Some(vec![Dim::Unknown; rank(len)?]);
            };
            let x = in_shape(0);
            let allow_zero = attr_i(node, "allowzero").unwrap_or(0) != 0;
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
                    .try_fold(1u64, |a, (_, d)| {
                        a.checked_mul(u64::try_from(d.known()?).ok()?)
                    });
                if let Some(v) = total.zip(known).and_then(|(t, k)| t.checked_div(k)) {
                    out[pos] = Dim::Known(i64::try_from(v).unwrap_or(i64::MAX));
                }
            }
            Some(out)
        }
        "Concat" => {
            let axis = attr_i(node, "axis")?;
            let first = in_shape(0)?;
            let axis = norm_axis(axis, first.len())?;
            let mut total = Some(0i64);
            for k in 0..node.input.len() {
                let s = in_shape(k)?;
                total = total.and_then(|t| t.checked_add(s.get(axis)?.known()?));
            }
            let mut out = first;
            *out.get_mut(axis)? = total.map(Dim::Known).unwrap_or(Dim::Unknown);
            Some(out)
        }
        "Shape" => Some(vec![Dim::Known(in_shape(0)?.len() as i64)]),
        "Constant" => {
            let a = node.attribute.first()?;
            match a.name.as_deref()? {
                "value" => Some(a.t.as_ref()?.dims.iter().map(|&d| Dim::Known(d)).collect()),
                "value_float" | "value_int" | "value_string" => Some(vec![]),
                "value_floats" => Some(vec![Dim::Known(a.floats.len() as i64)]),
                "value_ints" => Some(vec![Dim::Known(a.ints.len() as i64)]),
                _ => None,
            }
        }
        "Split" => {
            // Every output: the input's shape with the split axis unknown.
            let mut x = in_shape(0)?;
            let axis = attr_i(node, "axis").unwrap_or(0);
            let axis = norm_axis(axis, x.len())?;
            *x.get_mut(axis)? = Dim::Unknown;
            Some(x)
        }
        "Slice" => {
            let x = in_shape(0)?;
            let rank = x.len() as i64;
            let (starts, ends, axes, steps) = if node.input.len() > 1 {
                let starts = const_ints(1);
                let ends = const_ints(2);
                let axes = if node.input.len() > 3 && !node.input[3].is_empty() {
                    const_ints(3)
                } else {
                    starts.as_ref().map(|s| (0..s.len() as i64).collect())
                };
                let steps = if node.input.len() > 4 && !node.input[4].is_empty() {
                    const_ints(4)
                } else {
                    starts.as_ref().map(|s| vec![1; s.len()])
                };
                (starts, ends, axes, steps)
            } else {
                let starts = attr_ints(node, "starts").map(<[i64]>::to_vec);
                let axes = attr_ints(node, "axes")
                    .map(<[i64]>::to_vec)
                    .or_else(|| starts.as_ref().map(|s| (0..s.len() as i64).collect()));
                (
                    starts.clone(),
                    attr_ints(node, "ends").map(<[i64]>::to_vec),
                    axes,
                    starts.map(|s| vec![1; s.len()]),
                )
            };
            let (Some(starts), Some(ends), Some(axes), Some(steps)) = (starts, ends, axes, steps)
            else {
                return Some(vec![Dim::Unknown; x.len()]);
            };
            let mut out = x.clone();
            for (k, &axis) in axes.iter().enumerate() {
                let axis = if axis < 0 { axis + rank } else { axis };
                let (Some(&start), Some(&end), Some(&step)) =
                    (starts.get(k), ends.get(k), steps.get(k))
                else {
                    return None;
                };
                let slot = out.get_mut(usize::try_from(axis).ok()?)?;
                let Some(d) = slot.known() else {
                    *slot = Dim::Unknown;
                    continue;
                };
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
                *slot = Dim::Known(i64::try_from(len).ok()?);
            }
            Some(out)
        }
        "Resize" | "Pad" | "Tile" | "ConvTranspose" | "DepthToSpace" | "SpaceToDepth"
        | "Upsample" | "ReverseSequence" | "CumSum" | "Trilu" | "GridSample" => {
            // Rank-preserving; dims are not derived.
            Some(vec![Dim::Unknown; in_shape(0)?.len()])
        }
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" | "ReduceL1"
        | "ReduceL2" | "ReduceLogSumExp" | "ReduceSumSquare" | "ArgMax" | "ArgMin" => {
            let x = in_shape(0)?;
            let keep = attr_i(node, "keepdims").unwrap_or(1) != 0;
            let axes = match attr_ints(node, "axes").map(<[i64]>::to_vec).or_else(|| {
                if node.input.len() > 1 {
                    const_ints(1)
                } else {
                    None
                }
            }) {
                Some(a) => a,
                None if op.starts_with("Arg") => vec![attr_i(node, "axis").unwrap_or(0)],
                None if node.input.len() > 1 && !node.input[1].is_empty() => return None,
                None if attr_i(node, "noop_with_empty_axes").unwrap_or(0) != 0 => return Some(x),
                None => (0..x.len() as i64).collect(),
            };
            let axes: Vec<usize> = axes.iter().filter_map(|&a| norm_axis(a, x.len())).collect();
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
        "Expand" => {
            let x = in_shape(0)?;
            match const_ints(1) {
                Some(target) => {
                    broadcast(&x, &target.into_iter().map(Dim::Known).collect::<Vec<_>>()).map(
                        |b| {
                            b.into_iter()
                                .map(|d| if d == Dim::Known(1) { Dim::Unknown } else { d })
                                .collect()
                        },
                    )
                }
                None => {
                    let len = rank(in_shape(1)?.first()?.known()?)?;
                    Some(vec![Dim::Unknown; len.max(x.len())])
                }
            }
        }
        "Gather" => {
            let (x, idx) = (in_shape(0)?, in_shape(1)?);
            let axis = attr_i(node, "axis").unwrap_or(0);
            let axis = norm_axis(axis, x.len())?;
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
        "ConstantOfShape" => match const_ints(0) {
            Some(dims) => Some(dims.into_iter().map(Dim::Known).collect()),
            None => Some(vec![Dim::Unknown; rank(in_shape(0)?.first()?.known()?)?]),
        },
        "Range" | "NonZero" => Some(vec![Dim::Unknown; if op == "Range" { 1 } else { 2 }]),
        "Unsqueeze" | "Squeeze" => {
            let x = in_shape(0)?;
            let axes = attr_ints(node, "axes")
                .map(<[i64]>::to_vec)
                .or_else(|| const_ints(1));
            let rank = if op == "Unsqueeze" {
                x.len() + axes.as_ref()?.len()
            } else {
                x.len()
            };
            let norm = |a: i64| norm_axis(a, rank).unwrap_or(usize::MAX);
            if op == "Unsqueeze" {
                let axes: Vec<usize> = axes?.into_iter().map(norm).collect();
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
            } else {
                match axes {
                    Some(axes) => {
                        let axes: Vec<usize> = axes.into_iter().map(norm).collect();
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
        }
        _ => None,
    }
}
