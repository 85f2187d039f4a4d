//! Element types a backend lacks for an op, computed in one it has.

use super::emit::Emit;
use super::{data_io, input, output, Context};
use crate::declined::{invalid, native, unknown, unsupported, Declined};
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

/// ReduceMax / ReduceMin over booleans: the same reduction over int32 (any
/// for max, all for min), cast back.
pub(super) fn reduce_bool(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    if ctx.elem(x) != Some(ElemType::BOOL) {
        return Err(native("only boolean inputs are rewritten"));
    }
    let op = node.op_type.as_deref().unwrap_or("");
    let as_int = emit.cast(x, ElemType::INT32);
    let mut inputs: Vec<&str> = vec![&as_int];
    inputs.extend(node.input.iter().skip(1).map(String::as_str));
    let reduced = emit.op(op, &inputs, &[]);
    emit.copy_attributes(node);
    emit.cast_into(&reduced, ElemType::BOOL, y);
    Ok(())
}

/// BitShift with ONNX's meaning for shifts of the bit width or more (the
/// result is 0) instead of the machine's: `Where(y < bits, x ⋘ min(y,
/// bits - 1), 0)`.
pub(super) fn bit_shift(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no input"))?;
    let amount = input(node, 1).ok_or_else(|| invalid("no shift"))?;
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    let elem = ctx.input_elem(x)?;
    let bits: i64 = match elem {
        ElemType::UINT8 => 8,
        ElemType::UINT16 => 16,
        ElemType::UINT32 => 32,
        ElemType::UINT64 => 64,
        _ => return Err(unsupported(format!("type {elem}"))),
    };
    let to = |emit: &mut Emit, v: i64| -> Result<String, Declined> {
        let c = emit.constant::<i64>(&[], &[v])?;
        Ok(emit.cast(&c, elem))
    };
    let width = to(emit, bits)?;
    let top = to(emit, bits - 1)?;
    let zero = to(emit, 0)?;
    let fits = emit.op("Less", &[amount, &width], &[]);
    let clamped = emit.op("Min", &[amount, &top], &[]);
    let shifted = emit.op("BitShift", &[x, &clamped], &[]);
    emit.copy_attributes(node);
    emit.op_into("Where", &[&fits, &shifted, &zero], &[], &[Some(y)]);
    Ok(())
}

/// Max / Min over 16-bit integers: the same over int32 (every int16 and
/// uint16 value fits), cast back.
pub(super) fn widen_16bit(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    let elem = node
        .input
        .first()
        .and_then(|x| ctx.elem(x))
        .ok_or_else(|| unknown("input of unknown type"))?;
    if !matches!(elem, ElemType::INT16 | ElemType::UINT16) {
        return Err(native("only 16-bit integer inputs are rewritten"));
    }
    let wide: Vec<String> = node
        .input
        .iter()
        .map(|x| emit.cast(x, ElemType::INT32))
        .collect();
    let inputs: Vec<&str> = wide.iter().map(String::as_str).collect();
    let op = node.op_type.as_deref().unwrap_or("");
    let out = emit.op(op, &inputs, &[]);
    emit.cast_into(&out, elem, y);
    Ok(())
}

/// Pow with an unsigned integer exponent: the exponent as int64 (exact for
/// every exponent below 2^63; larger ones overflow any base but 0 and ±1).
pub(super) fn signed_exponent(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let x = input(node, 0).ok_or_else(|| invalid("no base"))?;
    let e = input(node, 1).ok_or_else(|| invalid("no exponent"))?;
    let y = output(node, 0).ok_or_else(|| invalid("no output"))?;
    let unsigned = matches!(
        ctx.elem(e),
        Some(ElemType::UINT8 | ElemType::UINT16 | ElemType::UINT32 | ElemType::UINT64)
    );
    if !unsigned {
        return Err(native("only unsigned exponents are rewritten"));
    }
    let signed = emit.cast(e, ElemType::INT64);
    emit.op_into("Pow", &[x, &signed], &[], &[Some(y)]);
    Ok(())
}

/// Cast to INT4 / UINT4 as the specification has it: out-of-range values
/// saturate and halves round to even (onnxruntime 1.32 wraps and rounds
/// halves away from zero): `Cast(Round(Clip(x, lo, hi)))`.
pub(super) fn saturating_cast_4bit(
    node: &NodeProto,
    ctx: &Context,
    emit: &mut Emit,
) -> Result<(), Declined> {
    let (x, y) = data_io(node)?;
    let to = super::attr_i(node, "to").ok_or_else(|| invalid("no target type"))?;
    let (lo, hi) = match i32::try_from(to).map(ElemType) {
        Ok(ElemType::INT4) => (-8.0f32, 7.0f32),
        Ok(ElemType::UINT4) => (0.0, 15.0),
        _ => return Err(native("only casts to INT4 and UINT4 are rewritten")),
    };
    let elem = ctx.input_elem(x)?;
    let float = matches!(
        elem,
        ElemType::FLOAT | ElemType::FLOAT16 | ElemType::DOUBLE | ElemType::BFLOAT16
    );
    let integer = ElemType::NUMERIC.contains(&elem) && elem != ElemType::BOOL;
    if !(float || integer) {
        return Err(unsupported(format!("input of type {elem}")));
    }
    let bound = |emit: &mut Emit, v: f32| -> Result<String, Declined> {
        let c = emit.constant::<f32>(&[], &[v])?;
        Ok(if elem == ElemType::FLOAT {
            c
        } else {
            emit.cast(&c, elem)
        })
    };
    let (lo, hi) = (bound(emit, lo)?, bound(emit, hi)?);
    let mut clipped = emit.op("Clip", &[x, &lo, &hi], &[]);
    if float {
        clipped = emit.op("Round", &[&clipped], &[]);
    }
    emit.cast_into(&clipped, ElemType(to as i32), y);
    Ok(())
}
