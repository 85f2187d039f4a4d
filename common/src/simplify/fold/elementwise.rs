//! Element-wise ops: unary math, broadcasting binary arithmetic,
//! comparisons and logic, `Where`, `Cast`/`CastLike`, `Identity`.

use super::{Args, Rule};
use crate::onnx::ElemType;
use crate::simplify::value::{indices, kind, strides, Data, Kind, Value};

pub(super) const RULES: &[(&str, Rule)] = &[
    ("Identity", identity),
    ("Cast", cast),
    ("CastLike", cast_like),
    ("Neg", neg),
    ("Abs", abs),
    ("Floor", |a| float_unary(a, f64::floor)),
    ("Ceil", |a| float_unary(a, f64::ceil)),
    ("Round", |a| float_unary(a, f64::round_ties_even)),
    ("Sqrt", |a| float_unary(a, f64::sqrt)),
    ("Reciprocal", |a| float_unary(a, f64::recip)),
    ("Exp", |a| float_unary(a, f64::exp)),
    ("Log", |a| float_unary(a, f64::ln)),
    ("Sigmoid", |a| float_unary(a, |x| 1.0 / (1.0 + (-x).exp()))),
    ("Tanh", |a| float_unary(a, f64::tanh)),
    ("Relu", relu),
    ("Sign", sign),
    ("Not", not),
    ("Add", |a| arith(a, |x, y| x.checked_add(y), |x, y| x + y)),
    ("Sub", |a| arith(a, |x, y| x.checked_sub(y), |x, y| x - y)),
    ("Mul", |a| arith(a, |x, y| x.checked_mul(y), |x, y| x * y)),
    // Integer division truncates toward zero, as onnxruntime's does.
    ("Div", |a| arith(a, |x, y| x.checked_div(y), |x, y| x / y)),
    ("Mod", modulo),
    ("Pow", pow),
    ("Max", |a| variadic(a, i64::max, f64::max)),
    ("Min", |a| variadic(a, i64::min, f64::min)),
    ("Sum", |a| variadic(a, i64::wrapping_add, |x, y| x + y)),
    ("Equal", |a| compare(a, |o| o == std::cmp::Ordering::Equal)),
    ("Less", |a| compare(a, |o| o == std::cmp::Ordering::Less)),
    ("Greater", |a| {
        compare(a, |o| o == std::cmp::Ordering::Greater)
    }),
    ("LessOrEqual", |a| {
        compare(a, |o| o != std::cmp::Ordering::Greater)
    }),
    ("GreaterOrEqual", |a| {
        compare(a, |o| o != std::cmp::Ordering::Less)
    }),
    ("And", |a| logic(a, |x, y| x && y)),
    ("Or", |a| logic(a, |x, y| x || y)),
    ("Xor", |a| logic(a, |x, y| x != y)),
    ("Where", where_),
];

fn identity(a: &Args) -> Option<Vec<Value>> {
    Some(vec![a.input(0)?.clone()])
}

fn cast(a: &Args) -> Option<Vec<Value>> {
    let to = ElemType(i32::try_from(a.int("to")?).ok()?);
    Some(vec![a.input(0)?.cast(to)?])
}

fn cast_like(a: &Args) -> Option<Vec<Value>> {
    Some(vec![a.input(0)?.cast(a.input(1)?.elem)?])
}

fn with_data(v: &Value, data: Data) -> Value {
    Value::new(v.elem, v.shape.clone(), data)
}

fn neg(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let data = match &x.data {
        Data::Int(v) => Data::Int(v.iter().map(|&x| x.checked_neg()).collect::<Option<_>>()?),
        Data::Float(v) => Data::Float(v.iter().map(|x| -x).collect()),
        Data::Bool(_) => return None,
    };
    Some(vec![with_data(x, data)])
}

fn abs(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let data = match &x.data {
        Data::Int(v) => Data::Int(v.iter().map(|&x| x.checked_abs()).collect::<Option<_>>()?),
        Data::Float(v) => Data::Float(v.iter().map(|x| x.abs()).collect()),
        Data::Bool(_) => return None,
    };
    Some(vec![with_data(x, data)])
}

fn relu(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let data = match &x.data {
        Data::Int(v) => Data::Int(v.iter().map(|&x| x.max(0)).collect()),
        Data::Float(v) => Data::Float(v.iter().map(|&x| x.max(0.0)).collect()),
        Data::Bool(_) => return None,
    };
    Some(vec![with_data(x, data)])
}

fn sign(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let data = match &x.data {
        Data::Int(v) => Data::Int(v.iter().map(|&x| x.signum()).collect()),
        Data::Float(v) => Data::Float(
            v.iter()
                .map(|&x| if x == 0.0 { 0.0 } else { x.signum() })
                .collect(),
        ),
        Data::Bool(_) => return None,
    };
    Some(vec![with_data(x, data)])
}

fn not(a: &Args) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let Data::Bool(v) = &x.data else { return None };
    Some(vec![with_data(
        x,
        Data::Bool(v.iter().map(|b| !b).collect()),
    )])
}

fn float_unary(a: &Args, f: fn(f64) -> f64) -> Option<Vec<Value>> {
    let x = a.input(0)?;
    let Data::Float(v) = &x.data else { return None };
    Some(vec![with_data(
        x,
        Data::Float(v.iter().map(|&x| f(x)).collect()),
    )])
}

/// The broadcast shape of `shapes` (numpy rules).
pub(crate) fn broadcast_shape(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max()?;
    let mut out = vec![1usize; rank];
    for s in shapes {
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[rank - s.len() + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(out)
}

/// For each element of `out`, the flat index into a tensor of `shape`
/// broadcast to it.
pub(crate) fn broadcast_index(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let own = strides(shape);
    let offset = out.len() - shape.len();
    indices(out)
        .map(|idx| {
            shape
                .iter()
                .enumerate()
                .map(|(i, &d)| if d == 1 { 0 } else { idx[i + offset] * own[i] })
                .sum()
        })
        .collect()
}

/// Inputs broadcast to one shape, each as the flat indices to read.
fn broadcast_all(values: &[&Value]) -> Option<(Vec<usize>, Vec<Vec<usize>>)> {
    let shapes: Vec<&[usize]> = values.iter().map(|v| v.shape.as_slice()).collect();
    let out = broadcast_shape(&shapes)?;
    let idx = shapes.iter().map(|s| broadcast_index(s, &out)).collect();
    Some((out, idx))
}

fn arith(
    a: &Args,
    int: fn(i64, i64) -> Option<i64>,
    float: fn(f64, f64) -> f64,
) -> Option<Vec<Value>> {
    let (x, y) = (a.input(0)?, a.input(1)?);
    if x.elem != y.elem {
        return None;
    }
    let (shape, idx) = broadcast_all(&[x, y])?;
    let data = match (&x.data, &y.data) {
        (Data::Int(p), Data::Int(q)) => Data::Int(
            idx[0]
                .iter()
                .zip(&idx[1])
                .map(|(&i, &j)| int(p[i], q[j]))
                .collect::<Option<_>>()?,
        ),
        (Data::Float(p), Data::Float(q)) => Data::Float(
            idx[0]
                .iter()
                .zip(&idx[1])
                .map(|(&i, &j)| float(p[i], q[j]))
                .collect(),
        ),
        _ => return None,
    };
    Some(vec![Value::new(x.elem, shape, data)])
}

fn modulo(a: &Args) -> Option<Vec<Value>> {
    if a.int("fmod").unwrap_or(0) != 0 {
        return arith(a, |x, y| x.checked_rem(y), |x, y| x % y);
    }
    // The sign of the divisor, as Python's `%`.
    arith(
        a,
        |x, y| {
            let r = x.checked_rem(y)?;
            Some(if r != 0 && (r < 0) != (y < 0) {
                r + y
            } else {
                r
            })
        },
        |x, y| {
            let r = x % y;
            if r != 0.0 && (r < 0.0) != (y < 0.0) {
                r + y
            } else {
                r
            }
        },
    )
}

fn pow(a: &Args) -> Option<Vec<Value>> {
    let (x, y) = (a.input(0)?, a.input(1)?);
    let (shape, idx) = broadcast_all(&[x, y])?;
    let (p, q) = (x.to_f64(), y.to_f64());
    let out: Vec<f64> = idx[0]
        .iter()
        .zip(&idx[1])
        .map(|(&i, &j)| p[i].powf(q[j]))
        .collect();
    Some(vec![Value::from_f64(x.elem, shape, out)?])
}

fn variadic(a: &Args, int: fn(i64, i64) -> i64, float: fn(f64, f64) -> f64) -> Option<Vec<Value>> {
    let values: Vec<&Value> = a.inputs.iter().copied().collect::<Option<_>>()?;
    let first = *values.first()?;
    if values.iter().any(|v| v.elem != first.elem) {
        return None;
    }
    let (shape, idx) = broadcast_all(&values)?;
    let n: usize = shape.iter().product();
    let data = match kind(first.elem)? {
        Kind::Int => {
            let vs: Vec<&[i64]> = values.iter().map(|v| v.as_ints()).collect::<Option<_>>()?;
            Data::Int(
                (0..n)
                    .map(|e| {
                        (1..vs.len()).fold(vs[0][idx[0][e]], |acc, k| int(acc, vs[k][idx[k][e]]))
                    })
                    .collect(),
            )
        }
        Kind::Float => {
            let vs: Vec<Vec<f64>> = values.iter().map(|v| v.to_f64()).collect();
            Data::Float(
                (0..n)
                    .map(|e| {
                        (1..vs.len()).fold(vs[0][idx[0][e]], |acc, k| float(acc, vs[k][idx[k][e]]))
                    })
                    .collect(),
            )
        }
        Kind::Bool => return None,
    };
    Some(vec![Value::new(first.elem, shape, data)])
}

fn compare(a: &Args, test: fn(std::cmp::Ordering) -> bool) -> Option<Vec<Value>> {
    let (x, y) = (a.input(0)?, a.input(1)?);
    let (shape, idx) = broadcast_all(&[x, y])?;
    let out: Vec<bool> = match (&x.data, &y.data) {
        (Data::Int(p), Data::Int(q)) => idx[0]
            .iter()
            .zip(&idx[1])
            .map(|(&i, &j)| test(p[i].cmp(&q[j])))
            .collect(),
        (Data::Bool(p), Data::Bool(q)) => idx[0]
            .iter()
            .zip(&idx[1])
            .map(|(&i, &j)| test(p[i].cmp(&q[j])))
            .collect(),
        _ => {
            let (p, q) = (x.to_f64(), y.to_f64());
            idx[0]
                .iter()
                .zip(&idx[1])
                .map(|(&i, &j)| p[i].partial_cmp(&q[j]).is_some_and(test))
                .collect()
        }
    };
    Some(vec![Value {
        elem: ElemType::BOOL,
        shape,
        data: Data::Bool(out),
    }])
}

fn logic(a: &Args, f: fn(bool, bool) -> bool) -> Option<Vec<Value>> {
    let (x, y) = (a.input(0)?, a.input(1)?);
    let (Data::Bool(p), Data::Bool(q)) = (&x.data, &y.data) else {
        return None;
    };
    let (shape, idx) = broadcast_all(&[x, y])?;
    let out = idx[0]
        .iter()
        .zip(&idx[1])
        .map(|(&i, &j)| f(p[i], q[j]))
        .collect();
    Some(vec![Value {
        elem: ElemType::BOOL,
        shape,
        data: Data::Bool(out),
    }])
}

fn where_(a: &Args) -> Option<Vec<Value>> {
    let (c, x, y) = (a.input(0)?, a.input(1)?, a.input(2)?);
    let Data::Bool(cond) = &c.data else {
        return None;
    };
    if x.elem != y.elem {
        return None;
    }
    let (shape, idx) = broadcast_all(&[c, x, y])?;
    let picks: Vec<(bool, usize, usize)> = (0..idx[0].len())
        .map(|e| (cond[idx[0][e]], idx[1][e], idx[2][e]))
        .collect();
    let data = match (&x.data, &y.data) {
        (Data::Int(p), Data::Int(q)) => Data::Int(
            picks
                .iter()
                .map(|&(c, i, j)| if c { p[i] } else { q[j] })
                .collect(),
        ),
        (Data::Float(p), Data::Float(q)) => Data::Float(
            picks
                .iter()
                .map(|&(c, i, j)| if c { p[i] } else { q[j] })
                .collect(),
        ),
        (Data::Bool(p), Data::Bool(q)) => Data::Bool(
            picks
                .iter()
                .map(|&(c, i, j)| if c { p[i] } else { q[j] })
                .collect(),
        ),
        _ => return None,
    };
    Some(vec![Value {
        elem: x.elem,
        shape,
        data,
    }])
}
