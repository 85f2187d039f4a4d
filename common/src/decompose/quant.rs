//! Quantization in float arithmetic where a backend's quantized kernels do
//! not cover the case: 16-bit types, blocked scales (opset 21), dequantizing
//! with scales computed at run time, and QLinearMatMul on int8 or with
//! non-f32 scales.
//! Rounding is half to even (ONNX `Round`) and results saturate to the
//! output type, as the operators define.

use super::emit::{Attr, Emit};
use super::{attr_i, input, output, Context};
use crate::declined::{invalid, native, unknown, unsupported, Declined};
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

/// The range of an integer type that quantization saturates to.
fn range(elem: ElemType) -> Option<(f32, f32)> {
    Some(match elem {
        ElemType::UINT8 => (0.0, 255.0),
        ElemType::INT8 => (-128.0, 127.0),
        ElemType::UINT16 => (0.0, 65535.0),
        ElemType::INT16 => (-32768.0, 32767.0),
        _ => return None,
    })
}

/// `value` (a scale or zero point) made broadcastable against `x`: as it
/// is when scalar or of one element, reshaped along `axis` when per-axis,
/// each entry repeated `block` times along `axis` when blocked.
fn broadcastable(
    emit: &mut Emit,
    ctx: &Context,
    value: &str,
    x: &str,
    axis: i64,
    block: i64,
) -> Result<String, Declined> {
    let shape = ctx
        .static_shape(value)
        .ok_or_else(|| unknown("scale shape is not static"))?;
    if shape.iter().product::<i64>() == 1 && block == 0 {
        return Ok(value.to_string());
    }
    let rank = ctx
        .rank(x)
        .ok_or_else(|| unknown("input of unknown rank"))? as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&axis) {
        return Err(invalid(format!("axis {axis} out of range")));
    }
    if block > 0 {
        let dims = ctx.input_shape(x)?;
        let index: Vec<i64> = (0..dims[axis as usize]).map(|i| i / block).collect();
        let index = emit.constant::<i64>(&[index.len()], &index)?;
        return Ok(emit.op("Gather", &[value, &index], &[Attr::Int("axis", axis)]));
    }
    if shape.len() != 1 {
        return Err(invalid("per-axis scale must be 1-D"));
    }
    let mut dims = vec![1i64; rank as usize];
    dims[axis as usize] = -1;
    let dims = emit.constant::<i64>(&[dims.len()], &dims)?;
    Ok(emit.op("Reshape", &[value, &dims], &[]))
}

/// `Cast(Clip(Round(v), range of to), to)`, with `v` of float type `elem`.
fn saturate(
    emit: &mut Emit,
    v: &str,
    elem: ElemType,
    to: ElemType,
    y: &str,
) -> Result<(), Declined> {
    let (lo, hi) = range(to).ok_or_else(|| unsupported(format!("output type {to}")))?;
    let rounded = emit.op("Round", &[v], &[]);
    let lo = emit.float_scalar(lo, elem)?;
    let hi = emit.float_scalar(hi, elem)?;
    let clipped = emit.op("Clip", &[&rounded, &lo, &hi], &[]);
    emit.cast_into(&clipped, to, y);
    Ok(())
}

pub(super) fn quantize_linear(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let scale = input(node, 1).ok_or_else(|| invalid("no scale"))?;
    let zero = input(node, 2);
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    let elem = ctx.input_elem(x)?;
    let to = match zero {
        Some(z) => ctx
            .elem(z)
            .ok_or_else(|| unknown("zero point of unknown type"))?,
        None => attr_i(node, "output_dtype")
            .filter(|&t| t != 0)
            .map_or(ElemType::UINT8, |t| ElemType(t as i32)),
    };
    let block = attr_i(node, "block_size").unwrap_or(0);
    if matches!(to, ElemType::UINT8 | ElemType::INT8) && block == 0 && ctx.is_constant(scale) {
        return Err(native("8-bit with a constant scale runs natively"));
    }
    range(to).ok_or_else(|| unsupported(format!("output type {to}")))?;
    let axis = attr_i(node, "axis").unwrap_or(1);
    let s = broadcastable(emit, ctx, scale, x, axis, block)?;
    // x / scale correctly rounded to x's type: divided in f64 (exact
    // enough that rounding to f32 or f16 afterwards is correct rounding),
    // since a backend may divide by a reciprocal, which moves values next
    // to a rounding tie across it (a dynamic-quantization node test does).
    let wide_x = emit.cast(x, ElemType::DOUBLE);
    let wide_s = emit.cast(&s, ElemType::DOUBLE);
    let quotient = emit.op("Div", &[&wide_x, &wide_s], &[]);
    let mut v = emit.cast(&quotient, elem);
    if let Some(z) = zero {
        // Rounded before the (integer) zero point is added, as the
        // reference does: with an odd zero point, round(v) + z and
        // round(v + z) differ on ties.
        let rounded = emit.op("Round", &[&v], &[]);
        let z = broadcastable(emit, ctx, z, x, axis, block)?;
        let z = emit.cast(&z, elem);
        v = emit.op("Add", &[&rounded, &z], &[]);
    }
    saturate(emit, &v, elem, to, y)
}

pub(super) fn dequantize_linear(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let scale = input(node, 1).ok_or_else(|| invalid("no scale"))?;
    let zero = input(node, 2);
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    let from = ctx.input_elem(x)?;
    let out = ctx
        .elem(scale)
        .ok_or_else(|| unknown("scale of unknown type"))?;
    let block = attr_i(node, "block_size").unwrap_or(0);
    if matches!(from, ElemType::UINT8 | ElemType::INT8) && block == 0 && ctx.is_constant(scale) {
        return Err(native("8-bit with a constant scale runs natively"));
    }
    range(from).ok_or_else(|| unsupported(format!("input type {from}")))?;
    let axis = attr_i(node, "axis").unwrap_or(1);
    let mut v = emit.cast(x, ElemType::FLOAT);
    if let Some(z) = zero {
        let z = broadcastable(emit, ctx, z, x, axis, block)?;
        let z = emit.cast(&z, ElemType::FLOAT);
        v = emit.op("Sub", &[&v, &z], &[]);
    }
    let s = broadcastable(emit, ctx, scale, x, axis, block)?;
    if out == ElemType::FLOAT {
        emit.op_into("Mul", &[&v, &s], &[], &[Some(y)]);
    } else {
        let s = emit.cast(&s, ElemType::FLOAT);
        let product = emit.op("Mul", &[&v, &s], &[]);
        emit.cast_into(&product, out, y);
    }
    Ok(())
}

/// QLinearMatMul: an exact int32 matmul of the zero-point-shifted inputs,
/// scaled by `a_scale · b_scale / y_scale` (computed in the scales' type),
/// shifted by `y_zero_point`, rounded and saturated. The rescaling is in
/// f32 (as onnxruntime's requantization; tract rounds only f32), exact for
/// accumulators below 2^24.
pub(super) fn qlinear_matmul(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let name = |k: usize| input(node, k).ok_or_else(|| invalid(format!("no input {k}")));
    let (a, sa, za, b, sb, zb, sy, zy) = (
        name(0)?,
        name(1)?,
        name(2)?,
        name(3)?,
        name(4)?,
        name(5)?,
        name(6)?,
        name(7)?,
    );
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    let a_elem = ctx.elem(a).ok_or_else(|| unknown("a of unknown type"))?;
    let scale_elem = ctx
        .elem(sa)
        .ok_or_else(|| unknown("scale of unknown type"))?;
    let to = ctx
        .elem(zy)
        .ok_or_else(|| unknown("y_zero_point of unknown type"))?;
    if a_elem == ElemType::UINT8 && scale_elem == ElemType::FLOAT {
        return Err(native("uint8 with float scales runs natively"));
    }
    let shifted = |emit: &mut Emit, v: &str, z: &str| {
        let v = emit.cast(v, ElemType::INT32);
        let z = emit.cast(z, ElemType::INT32);
        emit.op("Sub", &[&v, &z], &[])
    };
    let a = shifted(emit, a, za);
    let b = shifted(emit, b, zb);
    let c = emit.op("MatMul", &[&a, &b], &[]);
    let c = emit.cast(&c, ElemType::FLOAT);
    let ab = emit.op("Mul", &[sa, sb], &[]);
    let scale = emit.op("Div", &[&ab, sy], &[]);
    let scale = if scale_elem == ElemType::FLOAT {
        scale
    } else {
        emit.cast(&scale, ElemType::FLOAT)
    };
    let scaled = emit.op("Mul", &[&c, &scale], &[]);
    let z = emit.cast(zy, ElemType::FLOAT);
    let v = emit.op("Add", &[&scaled, &z], &[]);
    saturate(emit, &v, ElemType::FLOAT, to, y)
}
