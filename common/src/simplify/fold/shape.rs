//! Shape and data-movement ops: the ops of shape subgraphs (`Shape →
//! Gather → Concat → Reshape`) and their neighbours.

use super::elementwise::{broadcast_index, broadcast_shape};
use super::{Args, Rule};
use crate::onnx::ElemType;
use crate::simplify::value::{axis, drop_axes, indices, strides, Data, Value};

pub(super) const RULES: &[(&str, Rule)] = &[
    ("Shape", shape),
    ("Size", size),
    ("Reshape", reshape),
    ("Flatten", flatten),
    ("Squeeze", squeeze),
    ("Unsqueeze", unsqueeze),
    ("Concat", concat),
    ("Gather", gather),
    ("Slice", slice),
    ("Expand", expand),
    ("Tile", tile),
    ("Transpose", transpose),
    ("ConstantOfShape", constant_of_shape),
    ("Range", range),
    ("Split", split),
];

/// Dims from an int64 shape operand (non-negative).
fn dims(v: &Value) -> Option<Vec<usize>> {
    v.as_ints()?
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .collect()
}

/// The dims a `Shape` node of a rank-`rank` input returns (opset 15's
/// `start`/`end`).
pub(crate) fn shape_range(a: &Args, rank: usize) -> std::ops::Range<usize> {
    let r = rank as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(a.int("start").unwrap_or(0));
    let end = clamp(a.int("end").unwrap_or(r));
    start..end.max(start)
}

fn shape(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let dims = &x.shape[shape_range(a, x.shape.len())];
    Some(vec![Value::ints(dims.iter().map(|&d| d as i64).collect())])
}

fn size(a: &Args) -> Option<Vec<Value>> {
    let mut v = Value::ints(vec![a.input(0)?.len() as i64]);
    v.shape.clear();
    Some(vec![v])
}

fn reshape(a: &Args) -> Option<Vec<Value>> {
    let (x, target) = (a.input(0)?, a.input(1)?.as_ints()?);
    let allow_zero = a.int("allowzero").unwrap_or(0) != 0;
    let mut out: Vec<usize> = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &d) in target.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            0 if !allow_zero => out.push(*x.shape.get(i)?),
            d => out.push(usize::try_from(d).ok()?),
        }
    }
    if let Some(i) = infer {
        let known: usize = out.iter().product();
        if known == 0 || x.len() % known != 0 {
            return None;
        }
        out[i] = x.len() / known;
    }
    Some(vec![x.clone().reshaped(out)?])
}

fn flatten(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let rank = x.shape.len();
    let k = a.int("axis").unwrap_or(1);
    let k = if k < 0 { k + rank as i64 } else { k };
    let k = usize::try_from(k).ok().filter(|&k| k <= rank)?;
    let outer = x.shape[..k].iter().product();
    Some(vec![x
        .clone()
        .reshaped(vec![outer, x.len() / outer.max(1)])?])
}

fn squeeze(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let rank = x.shape.len();
    let shape: Vec<usize> = match a.ints_from("axes", 1) {
        Some(axes) => {
            let axes: Vec<usize> = axes.iter().map(|&k| axis(k, rank)).collect::<Option<_>>()?;
            if axes.iter().any(|&k| x.shape[k] != 1) {
                return None;
            }
            drop_axes(&x.shape, &axes)
        }
        None => x.shape.iter().copied().filter(|&d| d != 1).collect(),
    };
    Some(vec![x.clone().reshaped(shape)?])
}

fn unsqueeze(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let axes = a.ints_from("axes", 1)?;
    let rank = x.shape.len() + axes.len();
    let axes: Vec<usize> = axes.iter().map(|&k| axis(k, rank)).collect::<Option<_>>()?;
    let mut dims = x.shape.iter();
    let shape = (0..rank)
        .map(|i| {
            if axes.contains(&i) {
                Some(1)
            } else {
                dims.next().copied()
            }
        })
        .collect::<Option<_>>()?;
    Some(vec![x.clone().reshaped(shape)?])
}

/// Elements of `values` gathered as `(input, flat index)` pairs.
fn gather_elems(values: &[&Value], picks: &[(usize, usize)], shape: Vec<usize>) -> Option<Value> {
    let first = values.first()?;
    let data = match &first.data {
        Data::Int(_) => Data::Int(
            picks
                .iter()
                .map(|&(v, i)| values[v].as_ints()?.get(i).copied())
                .collect::<Option<_>>()?,
        ),
        Data::Float(_) => {
            let fs: Vec<Vec<f64>> = values.iter().map(|v| v.to_f64()).collect();
            Data::Float(
                picks
                    .iter()
                    .map(|&(v, i)| fs[v].get(i).copied())
                    .collect::<Option<_>>()?,
            )
        }
        Data::Bool(_) => {
            let bs: Vec<&[bool]> = values
                .iter()
                .map(|v| match &v.data {
                    Data::Bool(b) => Some(b.as_slice()),
                    _ => None,
                })
                .collect::<Option<_>>()?;
            Data::Bool(
                picks
                    .iter()
                    .map(|&(v, i)| bs[v].get(i).copied())
                    .collect::<Option<_>>()?,
            )
        }
    };
    Some(Value {
        elem: first.elem,
        shape,
        data,
    })
}

fn concat(a: &Args) -> Option<Vec<Value>> {
    let values: Vec<&Value> = a.inputs.iter().copied().collect::<Option<_>>()?;
    let first = *values.first()?;
    let rank = first.shape.len();
    let k = axis(a.int("axis")?, rank)?;
    if values
        .iter()
        .any(|v| v.elem != first.elem || v.shape.len() != rank)
    {
        return None;
    }
    let mut shape = first.shape.clone();
    shape[k] = values.iter().map(|v| v.shape[k]).sum();
    let outer: usize = shape[..k].iter().product();
    let mut picks = Vec::with_capacity(shape.iter().product());
    for o in 0..outer {
        for (vi, v) in values.iter().enumerate() {
            let block: usize = v.shape[k..].iter().product();
            picks.extend((0..block).map(|i| (vi, o * block + i)));
        }
    }
    Some(vec![gather_elems(&values, &picks, shape)?])
}

fn gather(a: &Args) -> Option<Vec<Value>> {
    let (x, idx) = (a.input(0)?, a.input(1)?);
    let rank = x.shape.len();
    let k = axis(a.int("axis").unwrap_or(0), rank)?;
    let dim = x.shape[k] as i64;
    let idx: Vec<usize> = idx
        .as_ints()?
        .iter()
        .map(|&i| {
            usize::try_from(if i < 0 { i + dim } else { i })
                .ok()
                .filter(|&i| (i as i64) < dim)
        })
        .collect::<Option<_>>()?;
    let shape: Vec<usize> = x.shape[..k]
        .iter()
        .chain(&a.input(1)?.shape)
        .chain(&x.shape[k + 1..])
        .copied()
        .collect();
    let outer: usize = x.shape[..k].iter().product();
    let inner: usize = x.shape[k + 1..].iter().product();
    let mut picks = Vec::with_capacity(shape.iter().product());
    for o in 0..outer {
        for &i in &idx {
            picks.extend((0..inner).map(|e| (0, (o * x.shape[k] + i) * inner + e)));
        }
    }
    Some(vec![gather_elems(&[x], &picks, shape)?])
}

fn slice(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let rank = x.shape.len();
    let (starts, ends) = if a.opset < 10 {
        (a.ints("starts")?, a.ints("ends")?)
    } else {
        (
            a.input(1)?.as_ints()?.to_vec(),
            a.input(2)?.as_ints()?.to_vec(),
        )
    };
    let axes = if a.opset < 10 {
        a.ints("axes")
    } else {
        a.input(3).and_then(|v| v.as_ints()).map(<[i64]>::to_vec)
    }
    .unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = a
        .input(4)
        .filter(|_| a.opset >= 10)
        .and_then(|v| v.as_ints())
        .map(<[i64]>::to_vec)
        .unwrap_or_else(|| vec![1; starts.len()]);
    // Per axis: the source positions kept, in order.
    let mut keep: Vec<Vec<usize>> = x.shape.iter().map(|&d| (0..d).collect()).collect();
    for (j, &ax) in axes.iter().enumerate() {
        let ax = axis(ax, rank)?;
        let d = x.shape[ax] as i64;
        let (start, end, step) = (*starts.get(j)?, *ends.get(j)?, *steps.get(j)?);
        let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
        let mut picked = Vec::new();
        if step > 0 {
            let (mut i, e) = (norm(start).clamp(0, d), norm(end).clamp(0, d));
            while i < e {
                picked.push(i as usize);
                i += step;
            }
        } else if step < 0 {
            let (mut i, e) = (norm(start).clamp(0, d - 1), norm(end).clamp(-1, d - 1));
            while i > e {
                picked.push(i as usize);
                i += step;
            }
        } else {
            return None;
        }
        keep[ax] = picked;
    }
    let shape: Vec<usize> = keep.iter().map(Vec::len).collect();
    let st = strides(&x.shape);
    let flat: Vec<usize> = indices(&shape)
        .map(|idx| {
            idx.iter()
                .enumerate()
                .map(|(k, &i)| keep[k][i] * st[k])
                .sum()
        })
        .collect();
    Some(vec![x.pick(&flat, shape)?])
}

fn expand(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let target = dims(a.input(1)?)?;
    let shape = broadcast_shape(&[&x.shape, &target])?;
    let flat = broadcast_index(&x.shape, &shape);
    Some(vec![x.pick(&flat, shape)?])
}

fn tile(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let reps = dims(a.input(1)?)?;
    if reps.len() != x.shape.len() {
        return None;
    }
    let shape: Vec<usize> = x.shape.iter().zip(&reps).map(|(d, r)| d * r).collect();
    let st = strides(&x.shape);
    let flat = indices(&shape)
        .map(|idx| {
            idx.iter()
                .enumerate()
                .map(|(k, &i)| (i % x.shape[k].max(1)) * st[k])
                .sum()
        })
        .collect::<Vec<usize>>();
    Some(vec![x.pick(&flat, shape)?])
}

fn transpose(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let rank = x.shape.len();
    let perm: Vec<usize> = match a.ints("perm") {
        Some(p) => p
            .iter()
            .map(|&k| usize::try_from(k).ok().filter(|&k| k < rank))
            .collect::<Option<_>>()?,
        None => (0..rank).rev().collect(),
    };
    if perm.len() != rank {
        return None;
    }
    let shape: Vec<usize> = perm.iter().map(|&k| x.shape[k]).collect();
    let st = strides(&x.shape);
    let flat = indices(&shape)
        .map(|idx| idx.iter().zip(&perm).map(|(&i, &k)| i * st[k]).sum())
        .collect::<Vec<usize>>();
    Some(vec![x.pick(&flat, shape)?])
}

fn constant_of_shape(a: &Args) -> Option<Vec<Value>> {
    let shape = dims(a.input(0)?)?;
    let n: usize = shape.iter().product();
    let fill = match crate::decompose::attr(a.node, "value").and_then(|v| v.t.as_ref()) {
        Some(t) => Value::from_proto(t)?,
        None => Value {
            elem: ElemType::FLOAT,
            shape: vec![1],
            data: Data::Float(vec![0.0]),
        },
    };
    let flat = vec![0; n];
    Some(vec![fill.pick(&flat, shape)?])
}

fn range(a: &Args) -> Option<Vec<Value>> {
    let (start, limit, delta) = (a.input(0)?, a.input(1)?, a.input(2)?);
    let (s, l, d) = (
        *start.to_f64().first()?,
        *limit.to_f64().first()?,
        *delta.to_f64().first()?,
    );
    if d == 0.0 {
        return None;
    }
    let n = ((l - s) / d).ceil().max(0.0);
    if n > 1.0e7 {
        return None;
    }
    let n = n as usize;
    let data = match &start.data {
        Data::Int(v) => {
            let (s, d) = (*v.first()?, *delta.as_ints()?.first()?);
            Data::Int((0..n as i64).map(|i| s + i * d).collect())
        }
        Data::Float(_) => Data::Float((0..n).map(|i| s + i as f64 * d).collect()),
        Data::Bool(_) => return None,
    };
    Some(vec![Value::new(start.elem, vec![n], data)])
}

fn split(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let rank = x.shape.len();
    let k = axis(a.int("axis").unwrap_or(0), rank)?;
    let outputs = a.node.output.len();
    let d = x.shape[k];
    let sizes: Vec<usize> = match a.ints_from("split", 1) {
        Some(s) => s
            .iter()
            .map(|&v| usize::try_from(v).ok())
            .collect::<Option<_>>()?,
        None => {
            let chunk = d.div_ceil(outputs.max(1));
            (0..outputs)
                .map(|i| chunk.min(d.saturating_sub(i * chunk)))
                .collect()
        }
    };
    if sizes.len() != outputs || sizes.iter().sum::<usize>() != d {
        return None;
    }
    let st = strides(&x.shape);
    let mut offset = 0;
    let mut out = Vec::with_capacity(outputs);
    for size in sizes {
        let mut shape = x.shape.clone();
        shape[k] = size;
        let flat = indices(&shape)
            .map(|idx| {
                idx.iter()
                    .enumerate()
                    .map(|(j, &i)| (if j == k { i + offset } else { i }) * st[j])
                    .sum()
            })
            .collect::<Vec<usize>>();
        out.push(x.pick(&flat, shape)?);
        offset += size;
    }
    Some(out)
}
