//! Conversions between Tessera and tract: tensors, element types, models.

use tessera_common::onnx::ElemType;
use tessera_common::tensor::Tensor;
use tract_onnx::prelude::{DatumType, IntoTensor, TValue, Tensor as TractTensor};

use crate::plugin::PluginError;

pub(super) fn datum_type(elem: ElemType) -> Option<DatumType> {
    Some(match elem {
        ElemType::FLOAT => DatumType::F32,
        ElemType::UINT8 => DatumType::U8,
        ElemType::INT8 => DatumType::I8,
        ElemType::UINT16 => DatumType::U16,
        ElemType::INT16 => DatumType::I16,
        ElemType::INT32 => DatumType::I32,
        ElemType::INT64 => DatumType::I64,
        ElemType::BOOL => DatumType::Bool,
        ElemType::FLOAT16 => DatumType::F16,
        ElemType::DOUBLE => DatumType::F64,
        ElemType::UINT32 => DatumType::U32,
        ElemType::UINT64 => DatumType::U64,
        _ => return None,
    })
}

pub(super) fn elem_type(dt: DatumType) -> Option<ElemType> {
    ElemType::NUMERIC
        .iter()
        .copied()
        .find(|&e| datum_type(e) == Some(dt))
}

/// A Tessera tensor as a tract tensor (one copy into tract's aligned buffer).
pub(super) fn to_tract(t: &Tensor) -> Result<TValue, PluginError> {
    let dt = datum_type(t.elem()).ok_or_else(|| {
        PluginError::BadInput(format!("element type {} is not supported", t.elem()))
    })?;
    // SAFETY: `Tensor` guarantees `bytes` holds exactly shape.product()
    // little-endian elements of `dt`, which is what tract reads.
    let tensor = unsafe { TractTensor::from_raw_dt(dt, t.shape(), t.bytes()) }
        .map_err(|e| PluginError::BadInput(e.to_string()))?;
    Ok(tensor.into())
}

/// A tract tensor's buffer, owned by a `Bytes` (outputs are not copied).
struct TractBytes(TractTensor);

impl AsRef<[u8]> for TractBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// A tract output as a Tessera tensor (TDim outputs become int64), over
/// tract's buffer without a copy.
pub(super) fn from_tract(v: TValue) -> Result<Tensor, PluginError> {
    let mut t: TractTensor = v.into_tensor();
    if t.datum_type() == DatumType::TDim {
        t = t
            .cast_to::<i64>()
            .map_err(|e| PluginError::Infer(e.to_string()))?
            .into_owned();
    }
    let elem = elem_type(t.datum_type()).ok_or_else(|| {
        PluginError::Infer(format!(
            "output type {:?} has no ONNX equivalent here",
            t.datum_type()
        ))
    })?;
    let shape = t.shape().to_vec();
    Tensor::new(elem, shape, bytes::Bytes::from_owner(TractBytes(t)))
        .map_err(|e| PluginError::Infer(e.to_string()))
}
