//! NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 12+), as in
//! their ONNX function bodies:
//!
//! ```text
//! t      = ignore_index given ? Where(target == ignore_index, 0, target) : target
//! picked = Squeeze(GatherElements(input, Unsqueeze(t, 1), axis 1), 1)
//! w      = weight[t] (if weight) · (target != ignore_index) (if ignore_index)
//! loss   = -picked · w
//! none: loss   sum: ReduceSum(loss)   mean: ReduceSum(loss) / ReduceSum(w)
//! ```
//! (mean without weight or ignore_index is ReduceMean(loss)).
//! SoftmaxCrossEntropyLoss is that over `LogSoftmax(scores, axis 1)`, whose
//! value is its optional second output.

use super::emit::{Attr, Emit};
use super::{attr_i, attr_s, input, output, Context};
use crate::declined::{invalid, unknown, unsupported, Declined};
use crate::onnx::ElemType;

pub(super) fn negative_log_likelihood(
    node: &crate::onnx::proto::NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let out = output(node, 0).ok_or_else(|| invalid("no output"))?;
    nll(node, ctx, emit, x, out)
}

pub(super) fn softmax_cross_entropy(
    node: &crate::onnx::proto::NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let scores = input(node, 0).ok_or_else(|| invalid("no scores"))?;
    let out = output(node, 0).ok_or_else(|| invalid("no output"))?;
    let rank = ctx
        .rank(scores)
        .ok_or_else(|| unknown("scores of unknown rank"))?;
    // Before opset 13, LogSoftmax flattens from `axis` on.
    if ctx.opset < 13 && rank > 2 {
        return Err(unsupported(
            "LogSoftmax over axis 1 of a rank > 2 tensor needs opset 13",
        ));
    }
    let log_prob = emit.op_into(
        "LogSoftmax",
        &[scores],
        &[Attr::Int("axis", 1)],
        &[output(node, 1)],
    );
    nll(node, ctx, emit, &log_prob[0], out)
}

/// The NLL expansion over log-probabilities `x`, writing `out`. `node`
/// holds the target (input 1), the optional weight (input 2) and the
/// `reduction` / `ignore_index` attributes.
fn nll(
    node: &crate::onnx::proto::NodeProto,
    ctx: &Context,
    emit: &mut Emit,
    x: &str,
    out: &str,
) -> Result<(), Declined> {
    let target = input(node, 1).ok_or_else(|| invalid("no target"))?;
    let weight = input(node, 2);
    let reduction = attr_s(node, "reduction").unwrap_or("mean");
    if !matches!(reduction, "none" | "sum" | "mean") {
        return Err(unsupported(format!("reduction '{reduction}'")));
    }
    let elem = ctx.elem(x).or(ctx.elem(node.input[0].as_str()));
    let elem = elem.ok_or_else(|| unknown("input of unknown type"))?;
    let target_elem = ctx
        .elem(target)
        .ok_or_else(|| unknown("target of unknown type"))?;
    if !matches!(target_elem, ElemType::INT64 | ElemType::INT32) {
        return Err(unsupported(format!("target of type {target_elem}")));
    }
    let ignore = attr_i(node, "ignore_index");
    let (t, ignored) = match ignore {
        Some(ig) => {
            let (ig, zero) = if target_elem == ElemType::INT64 {
                (
                    emit.constant::<i64>(&[], &[ig])?,
                    emit.constant::<i64>(&[], &[0])?,
                )
            } else {
                let ig = i32::try_from(ig).map_err(|_| unsupported("ignore_index out of int32"))?;
                (
                    emit.constant::<i32>(&[], &[ig])?,
                    emit.constant::<i32>(&[], &[0])?,
                )
            };
            let eq = emit.op("Equal", &[target, &ig], &[]);
            (emit.op("Where", &[&eq, &zero, target], &[]), Some(eq))
        }
        None => (target.to_string(), None),
    };
    let index = emit.unsqueeze(&t, &[1])?;
    let picked = emit.op("GatherElements", &[x, &index], &[Attr::Int("axis", 1)]);
    let picked = emit.squeeze(&picked, &[1])?;
    let mut w = weight.map(|w| emit.op("Gather", &[w, &t], &[Attr::Int("axis", 0)]));
    if let Some(eq) = ignored {
        let keep = emit.op("Not", &[&eq], &[]);
        let mask = emit.cast(&keep, elem);
        w = Some(match w {
            Some(w) => emit.op("Mul", &[&w, &mask], &[]),
            None => mask,
        });
    }
    let loss = |emit: &mut Emit, target: Option<&str>| match &w {
        Some(w) => {
            let neg = emit.op("Neg", &[&picked], &[]);
            emit.op_into("Mul", &[&neg, w], &[], &[target]).remove(0)
        }
        None => emit.op_into("Neg", &[&picked], &[], &[target]).remove(0),
    };
    match (reduction, &w) {
        ("none", _) => {
            loss(emit, Some(out));
        }
        ("sum", _) => {
            let l = loss(emit, None);
            emit.op_into(
                "ReduceSum",
                &[&l],
                &[Attr::Int("keepdims", 0)],
                &[Some(out)],
            );
        }
        (_, Some(w)) => {
            let l = loss(emit, None);
            let total = emit.reduce_all("ReduceSum", &l);
            let norm = emit.reduce_all("ReduceSum", w);
            emit.op_into("Div", &[&total, &norm], &[], &[Some(out)]);
        }
        (_, None) => {
            let l = loss(emit, None);
            emit.op_into(
                "ReduceMean",
                &[&l],
                &[Attr::Int("keepdims", 0)],
                &[Some(out)],
            );
        }
    }
    Ok(())
}
