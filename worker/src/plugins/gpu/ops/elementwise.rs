//! Elementwise ops: binary arithmetic with numpy broadcasting, unary
//! activations, BatchNormalization (inference).

use tessera_common::declined::{invalid, unknown, unsupported, Declined};
use tessera_common::onnx::proto::NodeProto;

use super::codes::{BinaryOp, UnaryOp};
use super::{attr_f, attr_i, attr_s, input, padded, strides, unknown_attrs, MAX_RANK};
use crate::plugins::gpu::builder::{groups_1d, Builder};

pub fn check(node: &NodeProto, _opset: i64) -> Result<(), Declined> {
    match node.op_type() {
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Relu" | "Sigmoid" | "Tanh" | "HardSwish"
        | "Erf" | "Exp" | "Neg" | "Abs" | "Sqrt" | "Reciprocal" | "Log" | "Floor" | "Ceil"
        | "Identity" => unknown_attrs(node, &[]),
        "Max" | "Min" => {
            if node.input.len() > 2 {
                return Err(unsupported("more than two inputs"));
            }
            unknown_attrs(node, &[])
        }
        "LeakyRelu" | "Elu" => unknown_attrs(node, &["alpha"]),
        "HardSigmoid" => unknown_attrs(node, &["alpha", "beta"]),
        "Clip" => unknown_attrs(node, &["min", "max"]),
        "Gelu" => {
            match attr_s(node, "approximate") {
                None | Some("none") | Some("tanh") => {}
                Some(other) => return Err(unsupported(format!("approximate '{other}'"))),
            }
            unknown_attrs(node, &["approximate"])
        }
        "BatchNormalization" => {
            if node.output.iter().filter(|o| !o.is_empty()).count() > 1 {
                return Err(unsupported("training mode (running statistics outputs)"));
            }
            if attr_i(node, "training_mode").unwrap_or(0) != 0 {
                return Err(unsupported("training mode"));
            }
            unknown_attrs(node, &["epsilon", "momentum", "training_mode", "spatial"]).and_then(
                |()| match attr_i(node, "spatial") {
                    Some(0) => Err(unsupported("spatial = 0")),
                    _ => Ok(()),
                },
            )
        }
        other => Err(unsupported(format!("{other} is not elementwise"))),
    }
}

/// Broadcast shape of `a` and `b` (numpy rules).
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, Declined> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        let off = rank - s.len();
        if i < off {
            1
        } else {
            s[i - off]
        }
    };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            (x, y) => Err(invalid(format!(
                "shapes {a:?} and {b:?} do not broadcast ({x} vs {y})"
            ))),
        })
        .collect()
}

/// Strides of `shape` read as broadcast to `out` (0 along broadcast axes).
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<u32> {
    let own = strides(shape);
    let off = out.len() - shape.len();
    (0..out.len())
        .map(|i| {
            if i < off || shape[i - off] == 1 {
                0
            } else {
                own[i - off] as u32
            }
        })
        .collect()
}

/// The unary kernel's op and its (alpha, beta) for `node`; an op type
/// without one is an error, never a silent Identity.
fn unary_code(node: &NodeProto) -> Result<(UnaryOp, f32, f32), Declined> {
    let a = |name: &str, default: f32| attr_f(node, name).unwrap_or(default);
    Ok(match node.op_type() {
        "Relu" => (UnaryOp::Relu, 0.0, 0.0),
        "LeakyRelu" => (UnaryOp::LeakyRelu, a("alpha", 0.01), 0.0),
        "Sigmoid" => (UnaryOp::Sigmoid, 0.0, 0.0),
        "Tanh" => (UnaryOp::Tanh, 0.0, 0.0),
        "HardSigmoid" => (UnaryOp::HardSigmoid, a("alpha", 0.2), a("beta", 0.5)),
        "HardSwish" => (UnaryOp::HardSwish, 0.0, 0.0),
        "Clip" => (UnaryOp::Clip, a("min", f32::MIN), a("max", f32::MAX)),
        "Erf" => (UnaryOp::Erf, 0.0, 0.0),
        "Gelu" if attr_s(node, "approximate") == Some("tanh") => (UnaryOp::GeluTanh, 0.0, 0.0),
        "Gelu" => (UnaryOp::Gelu, 0.0, 0.0),
        "Exp" => (UnaryOp::Exp, 0.0, 0.0),
        "Neg" => (UnaryOp::Neg, 0.0, 0.0),
        "Abs" => (UnaryOp::Abs, 0.0, 0.0),
        "Sqrt" => (UnaryOp::Sqrt, 0.0, 0.0),
        "Identity" => (UnaryOp::Identity, 0.0, 0.0),
        "Reciprocal" => (UnaryOp::Reciprocal, 0.0, 0.0),
        "Elu" => (UnaryOp::Elu, a("alpha", 1.0), 0.0),
        "Log" => (UnaryOp::Log, 0.0, 0.0),
        "Floor" => (UnaryOp::Floor, 0.0, 0.0),
        "Ceil" => (UnaryOp::Ceil, 0.0, 0.0),
        other => return Err(unsupported(format!("{other} has no elementwise kernel"))),
    })
}

fn unary(b: &mut Builder, node: &NodeProto, code: (UnaryOp, f32, f32)) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let shape = b.shape(x)?;
    let n: usize = shape.iter().product();
    let xs = b.slot(x)?;
    let ys = b.output(&node.output[0], shape)?;
    let params = [n as u32, code.0.code(), code.1.to_bits(), code.2.to_bits()];
    b.dispatch("unary", &[xs, ys], &params, groups_1d(n))
}

pub fn plan(b: &mut Builder, node: &NodeProto) -> Result<(), Declined> {
    let op = match node.op_type() {
        "BatchNormalization" => return batchnorm(b, node),
        "Clip" => {
            let (code, mut lo, mut hi) = unary_code(node)?;
            // Opset 11+: bounds as (constant) inputs.
            for (i, bound) in [(1, &mut lo), (2, &mut hi)] {
                if let Some(name) = input(node, i) {
                    let v = b
                        .floats(name)
                        .ok_or_else(|| unknown("clip bounds must be constants"))?;
                    *bound = *v.first().ok_or_else(|| invalid("empty clip bound"))?;
                }
            }
            return unary(b, node, (code, lo, hi));
        }
        other => match BinaryOp::of(other) {
            Some(op) => op,
            None => return unary(b, node, unary_code(node)?),
        },
    };
    // Max and Min of one input: the input itself.
    if node.input.len() == 1 {
        return unary(b, node, (UnaryOp::Identity, 0.0, 0.0));
    }
    let (x, z) = (
        input(node, 0).ok_or_else(|| invalid("no input A"))?,
        input(node, 1).ok_or_else(|| invalid("no input B"))?,
    );
    let (sx, sz) = (b.shape(x)?, b.shape(z)?);
    let out = broadcast(&sx, &sz)?;
    if out.len() > MAX_RANK {
        return Err(unsupported(format!("rank {} above {MAX_RANK}", out.len())));
    }
    let n: usize = out.iter().product();
    let (dims, sa, sb) = collapse(
        &out,
        &broadcast_strides(&sx, &out),
        &broadcast_strides(&sz, &out),
    );
    let mut params = vec![n as u32, dims.len() as u32, op.code()];
    params.extend(padded(&dims, MAX_RANK, 1));
    params.extend(padded(&sa, MAX_RANK, 0));
    params.extend(padded(&sb, MAX_RANK, 0));
    let (xs, zs) = (b.slot(x)?, b.slot(z)?);
    let ys = b.output(&node.output[0], out)?;
    b.dispatch("binary", &[xs, zs, ys], &params, groups_1d(n))
}

/// The fewest axes that index like (`dims`, `sa`, `sb`): axes of size 1
/// dropped, neighbours merged where both operands step through them as
/// one (contiguous, or both broadcast). Same shapes become one axis, a
/// per-channel operand two or three: less index arithmetic per element.
fn collapse(dims: &[usize], sa: &[u32], sb: &[u32]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let (mut d, mut a, mut b): (Vec<u32>, Vec<u32>, Vec<u32>) = (vec![], vec![], vec![]);
    for i in 0..dims.len() {
        if dims[i] == 1 {
            continue;
        }
        let n = dims[i] as u32;
        // Merge into the outer axis where it steps by this one's extent in
        // both operands.
        if let Some(k) = d.len().checked_sub(1) {
            if a[k] == sa[i] * n && b[k] == sb[i] * n {
                d[k] *= n;
                a[k] = sa[i];
                b[k] = sb[i];
                continue;
            }
        }
        d.push(n);
        a.push(sa[i]);
        b.push(sb[i]);
    }
    (d, a, b)
}

fn batchnorm(b: &mut Builder, node: &NodeProto) -> Result<(), Declined> {
    let names: Vec<&str> = (0..5)
        .map(|i| input(node, i).ok_or_else(|| invalid("BatchNormalization needs five inputs")))
        .collect::<Result<_, _>>()?;
    let shape = b.shape(names[0])?;
    if shape.len() < 2 {
        return Err(invalid("input of rank below 2"));
    }
    let c = shape[1];
    for name in &names[1..] {
        if b.shape(name)?.iter().product::<usize>() != c {
            return Err(invalid(format!("'{name}' does not have {c} channels")));
        }
    }
    let n: usize = shape.iter().product();
    let inner: usize = shape[2..].iter().product();
    let eps = attr_f(node, "epsilon").unwrap_or(1e-5);
    let mut slots = Vec::new();
    for name in &names {
        slots.push(b.slot(name)?);
    }
    slots.push(b.output(&node.output[0], shape)?);
    let params = [n as u32, c as u32, inner.max(1) as u32, eps.to_bits()];
    b.dispatch("batchnorm", &slots, &params, groups_1d(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::gpu::ops::OPS;

    fn node(op: &str) -> NodeProto {
        NodeProto {
            op_type: Some(op.into()),
            input: vec!["x".into()],
            output: vec!["y".into()],
            ..Default::default()
        }
    }

    /// Every op the plugin lists with an elementwise kernel resolves to a
    /// shader op code; anything else is refused, not run as Identity.
    #[test]
    fn every_elementwise_op_has_a_code() {
        let elementwise = OPS
            .iter()
            .filter(|(_, kernels)| kernels.contains(&"binary") || kernels == &["unary"]);
        let mut seen = 0;
        for (op, _) in elementwise {
            let coded = BinaryOp::of(op).is_some() || unary_code(&node(op)).is_ok();
            assert!(coded, "{op} has no op code");
            seen += 1;
        }
        assert!(seen >= UnaryOp::ALL.len(), "{seen} elementwise ops");
        let err = unary_code(&node("Softplus")).unwrap_err();
        assert!(
            matches!(&err, Declined::Unsupported(why) if why.contains("Softplus")),
            "{err}"
        );
    }
}
