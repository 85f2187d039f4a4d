//! The optimizers of `ai.onnx.preview.training` (Adagrad, Momentum, Adam),
//! element-wise updates of n tensors at once, written as standard ops after
//! their specifications. Inputs: the learning rate R and the step count T
//! (scalars), then the n tensors X, their gradients G and the optimizer's
//! state (Adagrad: H; Momentum: V; Adam: V then H), n of each. Outputs:
//! the new X then the new state, n of each. Every update starts from
//! `G' = norm_coefficient · X + G`:
//!
//! ```text
//! Adagrad   r = R / (1 + T·decay_factor);  H' = H + G'²
//!           X' = X − r·G' / (√H' + epsilon)
//! Momentum  b = T > 0 ? beta : 1;  V' = alpha·V + b·G'
//!           standard: X' = X − R·V'    nesterov: X' = X − R·(G' + alpha·V')
//! Adam      V' = alpha·V + (1 − alpha)·G';  H' = beta·H + (1 − beta)·G'²
//!           r = T > 0 ? R·√(1 − beta^T) / (1 − alpha^T) : R
//!           X' = (1 − norm_coefficient_post)·(X − r·V' / (√H' + epsilon))
//! ```
//! All arithmetic is in X's element type (R and T are cast to it).

use super::emit::Emit;
use super::{input, output, Context};
use crate::declined::{invalid, unknown, unsupported, Declined};
use crate::onnx::attr::attr_f;
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

/// R, T (cast to X's type), and the n groups of `groups` inputs after them.
struct Update<'a> {
    elem: ElemType,
    rate: String,
    step: String,
    n: usize,
    node: &'a NodeProto,
}

impl<'a> Update<'a> {
    fn new(
        node: &'a NodeProto,
        ctx: &Context,
        emit: &mut Emit,
        groups: usize,
    ) -> Result<Update<'a>, Declined> {
        let count = node.input.len().saturating_sub(2);
        if count == 0 || count % groups != 0 || node.output.len() != count / groups * (groups - 1) {
            return Err(unsupported(format!(
                "{} inputs and {} outputs do not make groups of {groups}",
                node.input.len(),
                node.output.len()
            )));
        }
        let n = count / groups;
        let x = input(node, 2).ok_or_else(|| invalid("no X"))?;
        let elem = ctx.elem(x).ok_or_else(|| unknown("X of unknown type"))?;
        if !matches!(elem, ElemType::FLOAT | ElemType::DOUBLE) {
            return Err(unsupported(format!("X of type {elem}")));
        }
        let rate = emit.cast(input(node, 0).ok_or_else(|| invalid("no R"))?, elem);
        let step = emit.cast(input(node, 1).ok_or_else(|| invalid("no T"))?, elem);
        Ok(Update {
            elem,
            rate,
            step,
            n,
            node,
        })
    }

    /// Input `k` of group `group` (0: X, 1: G, then the state).
    fn input(&self, group: usize, k: usize) -> Result<&'a str, Declined> {
        input(self.node, 2 + group * self.n + k)
            .ok_or_else(|| invalid(format!("input {} is missing", 2 + group * self.n + k)))
    }

    /// Output `k` of output group `group` (0: X', then the state).
    fn output(&self, group: usize, k: usize) -> Option<&'a str> {
        output(self.node, group * self.n + k)
    }

    fn scalar(&self, emit: &mut Emit, v: f32) -> Result<String, Declined> {
        emit.float_scalar(v, self.elem)
    }

    /// `norm_coefficient · X + G` for tensor `k`.
    fn regularized(&self, emit: &mut Emit, k: usize) -> Result<String, Declined> {
        let norm = self.scalar(emit, attr_f(self.node, "norm_coefficient").unwrap_or(0.0))?;
        let scaled = emit.op("Mul", &[&norm, self.input(0, k)?], &[]);
        Ok(emit.op("Add", &[&scaled, self.input(1, k)?], &[]))
    }

    /// `T > 0`.
    fn started(&self, emit: &mut Emit) -> Result<String, Declined> {
        let zero = self.scalar(emit, 0.0)?;
        Ok(emit.op("Greater", &[&self.step, &zero], &[]))
    }

    /// Writes `op(a, b)` into output `k` of output group `group` (a fresh
    /// name where the output is not wanted).
    fn write(&self, emit: &mut Emit, op: &str, a: &str, b: &str, group: usize, k: usize) -> String {
        emit.op_into(op, &[a, b], &[], &[self.output(group, k)])
            .remove(0)
    }
}

pub(super) fn adagrad(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    let u = Update::new(node, ctx, emit, 3)?;
    let one = u.scalar(emit, 1.0)?;
    let decay = u.scalar(emit, attr_f(node, "decay_factor").unwrap_or(0.0))?;
    let epsilon = u.scalar(emit, attr_f(node, "epsilon").unwrap_or(1e-6))?;
    let decayed = emit.op("Mul", &[&u.step, &decay], &[]);
    let denominator = emit.op("Add", &[&one, &decayed], &[]);
    let rate = emit.op("Div", &[&u.rate, &denominator], &[]);
    for k in 0..u.n {
        let g = u.regularized(emit, k)?;
        let squared = emit.op("Mul", &[&g, &g], &[]);
        let h = u.write(emit, "Add", u.input(2, k)?, &squared, 1, k);
        let root = emit.op("Sqrt", &[&h], &[]);
        let scale = emit.op("Add", &[&root, &epsilon], &[]);
        let step = emit.op("Mul", &[&rate, &g], &[]);
        let step = emit.op("Div", &[&step, &scale], &[]);
        u.write(emit, "Sub", u.input(0, k)?, &step, 0, k);
    }
    Ok(())
}

pub(super) fn momentum(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    let nesterov = match super::attr_s(node, "mode").unwrap_or("standard") {
        "standard" => false,
        "nesterov" => true,
        other => return Err(unsupported(format!("mode '{other}'"))),
    };
    let required =
        |name: &str| attr_f(node, name).ok_or_else(|| invalid(format!("no {name} attribute")));
    let (alpha, beta) = (required("alpha")?, required("beta")?);
    let u = Update::new(node, ctx, emit, 3)?;
    let alpha = u.scalar(emit, alpha)?;
    let beta = u.scalar(emit, beta)?;
    let one = u.scalar(emit, 1.0)?;
    let started = u.started(emit)?;
    let beta = emit.op("Where", &[&started, &beta, &one], &[]);
    for k in 0..u.n {
        let g = u.regularized(emit, k)?;
        let kept = emit.op("Mul", &[&alpha, u.input(2, k)?], &[]);
        let added = emit.op("Mul", &[&beta, &g], &[]);
        let v = u.write(emit, "Add", &kept, &added, 1, k);
        let direction = if nesterov {
            let ahead = emit.op("Mul", &[&alpha, &v], &[]);
            emit.op("Add", &[&g, &ahead], &[])
        } else {
            v
        };
        let step = emit.op("Mul", &[&u.rate, &direction], &[]);
        u.write(emit, "Sub", u.input(0, k)?, &step, 0, k);
    }
    Ok(())
}

pub(super) fn adam(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    let u = Update::new(node, ctx, emit, 4)?;
    let f = |name: &str, default: f32| attr_f(node, name).unwrap_or(default);
    let (alpha, beta) = (f("alpha", 0.9), f("beta", 0.999));
    let post = 1.0 - f("norm_coefficient_post", 0.0);
    let one = u.scalar(emit, 1.0)?;
    let epsilon = u.scalar(emit, f("epsilon", 1e-6))?;
    let alpha_c = u.scalar(emit, alpha)?;
    let beta_c = u.scalar(emit, beta)?;
    let (rest_alpha, rest_beta) = (u.scalar(emit, 1.0 - alpha)?, u.scalar(emit, 1.0 - beta)?);
    let post = u.scalar(emit, post)?;
    // r = T > 0 ? R·√(1 − beta^T) / (1 − alpha^T) : R
    let beta_t = emit.op("Pow", &[&beta_c, &u.step], &[]);
    let alpha_t = emit.op("Pow", &[&alpha_c, &u.step], &[]);
    let beta_rest = emit.op("Sub", &[&one, &beta_t], &[]);
    let alpha_rest = emit.op("Sub", &[&one, &alpha_t], &[]);
    let root = emit.op("Sqrt", &[&beta_rest], &[]);
    let corrected = emit.op("Mul", &[&u.rate, &root], &[]);
    let corrected = emit.op("Div", &[&corrected, &alpha_rest], &[]);
    let started = u.started(emit)?;
    let rate = emit.op("Where", &[&started, &corrected, &u.rate], &[]);
    for k in 0..u.n {
        let g = u.regularized(emit, k)?;
        let kept = emit.op("Mul", &[&alpha_c, u.input(2, k)?], &[]);
        let added = emit.op("Mul", &[&rest_alpha, &g], &[]);
        let v = u.write(emit, "Add", &kept, &added, 1, k);
        let squared = emit.op("Mul", &[&g, &g], &[]);
        let kept = emit.op("Mul", &[&beta_c, u.input(3, k)?], &[]);
        let added = emit.op("Mul", &[&rest_beta, &squared], &[]);
        let h = u.write(emit, "Add", &kept, &added, 2, k);
        let root = emit.op("Sqrt", &[&h], &[]);
        let scale = emit.op("Add", &[&root, &epsilon], &[]);
        let ratio = emit.op("Div", &[&v, &scale], &[]);
        let step = emit.op("Mul", &[&rate, &ratio], &[]);
        let x = emit.op("Sub", &[u.input(0, k)?, &step], &[]);
        u.write(emit, "Mul", &post, &x, 0, k);
    }
    Ok(())
}
