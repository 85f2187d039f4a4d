//! Selection, small linear algebra, training-mode and optional ops with
//! constant parameters: Compress, Det (2×2, 3×3), Dropout without dropping,
//! BatchNormalization in training mode, Optional* on plain tensors, and the
//! `ai.onnx.ml` Binarizer and ArrayFeatureExtractor.

use super::emit::{Attr, Emit};
use super::{attr, attr_i, data_io, input, output, Context};
use crate::declined::{invalid, native, unknown, unsupported, Declined};
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

/// Compress with a constant condition: a Gather of the selected positions
/// (of the flattened input when there is no axis).
pub(super) fn compress(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    let condition = ctx
        .const_floats(input(node, 1).ok_or_else(|| invalid("no condition"))?)
        .ok_or_else(|| unknown("condition is not a constant"))?;
    let picked: Vec<i64> = (0..condition.len() as i64)
        .filter(|&i| condition[i as usize] != 0.0)
        .collect();
    let index = emit.constant::<i64>(&[picked.len()], &picked)?;
    match attr_i(node, "axis") {
        Some(axis) => {
            let rank = ctx
                .rank(x)
                .ok_or_else(|| unknown("input of unknown rank"))? as i64;
            let axis = if axis < 0 { axis + rank } else { axis };
            let dims = ctx.static_shape(x);
            if dims.is_some_and(|d| (condition.len() as i64) > d[axis as usize]) {
                return Err(unsupported("condition longer than the axis"));
            }
            emit.op_into(
                "Gather",
                &[x, &index],
                &[Attr::Int("axis", axis)],
                &[Some(y)],
            );
        }
        None => {
            let flat = emit.constant::<i64>(&[1], &[-1])?;
            let flat = emit.op("Reshape", &[x, &flat], &[]);
            emit.op_into(
                "Gather",
                &[&flat, &index],
                &[Attr::Int("axis", 0)],
                &[Some(y)],
            );
        }
    }
    Ok(())
}

/// Det of 2×2 and 3×3 matrices (batched): the Leibniz formula over the
/// gathered entries.
pub(super) fn det(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    let dims = ctx.input_shape(x)?;
    let r = dims.len();
    if r < 2 || dims[r - 1] != dims[r - 2] || !(2..=3).contains(&dims[r - 1]) {
        return Err(unsupported("only 2×2 and 3×3 matrices"));
    }
    let n = dims[r - 1];
    let mut shape: Vec<i64> = dims[..r - 2].to_vec();
    shape.push(n * n);
    let shape = emit.constant::<i64>(&[shape.len()], &shape)?;
    let flat = emit.op("Reshape", &[x, &shape], &[]);
    let mut entry = Vec::new();
    for k in 0..n * n {
        let at = emit.constant::<i64>(&[], &[k])?;
        entry.push(emit.op("Gather", &[&flat, &at], &[Attr::Int("axis", -1)]));
    }
    let e = |i: i64, j: i64| entry[(i * n + j) as usize].clone();
    let product = |emit: &mut Emit, terms: &[String]| {
        terms[1..]
            .iter()
            .fold(terms[0].clone(), |acc, t| emit.op("Mul", &[&acc, t], &[]))
    };
    if n == 2 {
        let ad = product(emit, &[e(0, 0), e(1, 1)]);
        let bc = product(emit, &[e(0, 1), e(1, 0)]);
        emit.op_into("Sub", &[&ad, &bc], &[], &[Some(y)]);
        return Ok(());
    }
    let even = [[0, 1, 2], [1, 2, 0], [2, 0, 1]];
    let odd = [[0, 2, 1], [1, 0, 2], [2, 1, 0]];
    let sum = |emit: &mut Emit, perms: &[[i64; 3]]| {
        let terms: Vec<String> = perms
            .iter()
            .map(|p| product(emit, &[e(0, p[0]), e(1, p[1]), e(2, p[2])]))
            .collect();
        let first = emit.op("Add", &[&terms[0], &terms[1]], &[]);
        emit.op("Add", &[&first, &terms[2]], &[])
    };
    let plus = sum(emit, &even);
    let minus = sum(emit, &odd);
    emit.op_into("Sub", &[&plus, &minus], &[], &[Some(y)]);
    Ok(())
}

/// Dropout in training mode with a constant ratio of 0 drops nothing: the
/// input, and an all-true mask.
pub(super) fn dropout(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    let Some(training) = input(node, 2) else {
        return Err(native("inference mode runs natively"));
    };
    let training = ctx
        .const_floats(training)
        .ok_or_else(|| unknown("training_mode is not a constant"))?;
    let ratio = match input(node, 1) {
        Some(r) => ctx
            .const_floats(r)
            .ok_or_else(|| unknown("ratio is not a constant"))?,
        None => vec![0.5],
    };
    if training.first() == Some(&0.0) {
        return Err(native("inference mode runs natively"));
    }
    if ratio.first() != Some(&0.0) {
        return Err(unsupported("random dropout"));
    }
    emit.op_into("Identity", &[x], &[], &[Some(y)]);
    if let Some(mask) = output(node, 1) {
        let shape = emit.op("Shape", &[x], &[]);
        let yes = emit.constant::<bool>(&[], &[true])?;
        emit.op_into("Expand", &[&yes, &shape], &[], &[Some(mask)]);
    }
    Ok(())
}

/// OptionalHasElement: false without an input, true for a plain tensor.
pub(super) fn optional_has_element(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    let has = match input(node, 0) {
        None => false,
        Some(x) if ctx.elem(x).is_some() && ctx.rank(x).is_some() => true,
        Some(_) => return Err(unsupported("an optional or sequence input")),
    };
    let c = emit.constant::<bool>(&[], &[has])?;
    emit.op_into("Identity", &[&c], &[], &[Some(y)]);
    Ok(())
}

/// OptionalGetElement of a plain tensor is the tensor.
pub(super) fn optional_get_element(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    if ctx.elem(x).is_none() || ctx.rank(x).is_none() {
        return Err(unsupported("an optional or sequence input"));
    }
    emit.op_into("Identity", &[x], &[], &[Some(y)]);
    Ok(())
}

/// BatchNormalization in training mode (opset 14+): normalized with the
/// batch statistics (population variance), running statistics updated with
/// `momentum`, as the reference implementation.
pub(super) fn batch_norm_training(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    if attr_i(node, "training_mode").unwrap_or(0) == 0 {
        return Err(native("inference mode runs natively"));
    }
    let name = |k: usize| input(node, k).ok_or_else(|| invalid(format!("no input {k}")));
    let (x, scale, bias, mean, var) = (name(0)?, name(1)?, name(2)?, name(3)?, name(4)?);
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    let elem = ctx.input_elem(x)?;
    let rank = ctx
        .rank(x)
        .ok_or_else(|| unknown("input of unknown rank"))? as i64;
    if rank < 2 {
        return Err(unsupported("rank below 2"));
    }
    let epsilon = attr(node, "epsilon").and_then(|a| a.f).unwrap_or(1e-5);
    let momentum = attr(node, "momentum").and_then(|a| a.f).unwrap_or(0.9);
    let axes: Vec<i64> = (0..rank).filter(|&a| a != 1).collect();
    let mut per_channel = vec![1i64; rank as usize];
    per_channel[1] = -1;
    let per_channel = emit.constant::<i64>(&[per_channel.len()], &per_channel)?;
    let batch_mean = emit.reduce("ReduceMean", x, &axes, true)?;
    let centred = emit.op("Sub", &[x, &batch_mean], &[]);
    let squared = emit.op("Mul", &[&centred, &centred], &[]);
    let batch_var = emit.reduce("ReduceMean", &squared, &axes, true)?;
    let eps = emit.float_scalar(epsilon, elem)?;
    let var_eps = emit.op("Add", &[&batch_var, &eps], &[]);
    let std = emit.op("Sqrt", &[&var_eps], &[]);
    let normalized = emit.op("Div", &[&centred, &std], &[]);
    let s = emit.op("Reshape", &[scale, &per_channel], &[]);
    let b = emit.op("Reshape", &[bias, &per_channel], &[]);
    let scaled = emit.op("Mul", &[&normalized, &s], &[]);
    emit.op_into("Add", &[&scaled, &b], &[], &[Some(y)]);
    let keep = emit.float_scalar(momentum, elem)?;
    let take = emit.float_scalar(1.0 - momentum, elem)?;
    let channels = emit.constant::<i64>(&[1], &[-1])?;
    for (k, running, batch) in [(1, mean, &batch_mean), (2, var, &batch_var)] {
        let Some(out) = output(node, k) else { continue };
        let batch = emit.op("Reshape", &[batch, &channels], &[]);
        let old = emit.op("Mul", &[running, &keep], &[]);
        let new = emit.op("Mul", &[&batch, &take], &[]);
        emit.op_into("Add", &[&old, &new], &[], &[Some(out)]);
    }
    Ok(())
}

/// Binarizer (`ai.onnx.ml`): 1 where the input exceeds the threshold.
pub(super) fn binarizer(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    let elem = ctx.input_elem(x)?;
    if !matches!(elem.0, 1 | 11) {
        return Err(unsupported(format!("input of type {elem}")));
    }
    let threshold = attr(node, "threshold").and_then(|a| a.f).unwrap_or(0.0);
    let t = emit.float_scalar(threshold, elem)?;
    let above = emit.op("Greater", &[x, &t], &[]);
    emit.cast_into(&above, elem, y);
    Ok(())
}

/// ArrayFeatureExtractor (`ai.onnx.ml`): a Gather along the last axis.
pub(super) fn array_feature_extractor(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let indices = input(node, 1).ok_or_else(|| invalid("no indices"))?;
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    if ctx.rank(x).is_none_or(|r| r < 2) || ctx.rank(indices) != Some(1) {
        return Err(unsupported("only rank ≥ 2 inputs with 1-D indices"));
    }
    if ctx.elem(indices) != Some(ElemType::INT64) {
        return Err(invalid("indices must be int64"));
    }
    emit.op_into(
        "Gather",
        &[x, indices],
        &[Attr::Int("axis", -1)],
        &[Some(y)],
    );
    Ok(())
}
