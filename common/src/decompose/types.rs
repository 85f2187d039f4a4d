//! Element types a backend lacks for an op, computed in one it has.

use super::emit::Emit;
use super::{data_io, input, output, Context};
use crate::onnx::proto::NodeProto;
use crate::onnx::ElemType;

/// ReduceMax / ReduceMin over booleans: the same reduction over int32 (any
/// for max, all for min), cast back.
pub(super) fn reduce_bool(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), String> {
    let (x, y) = data_io(node)?;
    if ctx.elem(x) != Some(ElemType::BOOL) {
        return Err("only boolean inputs are rewritten".into());
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
pub(super) fn bit_shift(node: &NodeProto, ctx: &Context, emit: &mut Emit) -> Result<(), String> {
    let x = input(node, 0).ok_or("no input")?;
    let amount = input(node, 1).ok_or("no shift")?;
    let y = output(node, 0).ok_or("no output")?;
    let elem = ctx.elem(x).ok_or("input of unknown type")?;
    let bits: i64 = match elem {
        ElemType::UINT8 => 8,
        ElemType::UINT16 => 16,
        ElemType::UINT32 => 32,
        ElemType::UINT64 => 64,
        _ => return Err(format!("type {elem}")),
    };
    let to = |emit: &mut Emit, v: i64| -> Result<String, String> {
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
