//! Conversions between Tessera tensors and onnxruntime values.

use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::SessionInputValue;
use ort::value::{
    DynTensor, DynTensorValueType, DynValue, PrimitiveTensorElementType, Shape, TensorElementType,
    TensorRefMut, Utf8Data, ValueType,
};
use tessera_common::onnx::ElemType;
use tessera_common::tensor::Tensor;

use crate::plugin::{PluginError, TensorSpec};

/// ONNX element types (`TensorProto.DataType`) onnxruntime values carry
/// here: the types a Tessera tensor holds (the 4-bit ones packed two to a
/// byte in both).
const TYPES: [(i32, TensorElementType); 20] = [
    (1, TensorElementType::Float32),
    (2, TensorElementType::Uint8),
    (3, TensorElementType::Int8),
    (4, TensorElementType::Uint16),
    (5, TensorElementType::Int16),
    (6, TensorElementType::Int32),
    (7, TensorElementType::Int64),
    (9, TensorElementType::Bool),
    (10, TensorElementType::Float16),
    (11, TensorElementType::Float64),
    (12, TensorElementType::Uint32),
    (13, TensorElementType::Uint64),
    (16, TensorElementType::Bfloat16),
    (17, TensorElementType::Float8E4M3FN),
    (18, TensorElementType::Float8E4M3FNUZ),
    (19, TensorElementType::Float8E5M2),
    (20, TensorElementType::Float8E5M2FNUZ),
    (21, TensorElementType::Uint4),
    (22, TensorElementType::Int4),
    (8, TensorElementType::String),
];

/// A string element as onnxruntime takes it (bytes, not checked as UTF-8
/// by onnxruntime; a NUL inside is refused).
#[derive(Clone)]
struct StringBytes(Vec<u8>);

impl Utf8Data for StringBytes {
    fn as_utf8_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A string tensor as an onnxruntime tensor.
fn strings_to_ort(t: &Tensor) -> Result<DynTensor, PluginError> {
    let bad = |e: String| PluginError::BadInput(format!("a string tensor: {e}"));
    let values: Vec<StringBytes> = t
        .strings()
        .map_err(|e| bad(e.to_string()))?
        .into_iter()
        .map(|s| StringBytes(s.to_vec()))
        .collect();
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    ort::value::Tensor::from_string_array((shape, &values[..]))
        .map(ort::value::Tensor::upcast)
        .map_err(|e| bad(e.to_string()))
}

/// An onnxruntime string tensor as a Tessera tensor.
fn strings_from_ort(
    name: &str,
    tensor: &DynTensor,
    dims: Vec<usize>,
) -> Result<Tensor, PluginError> {
    let (_, strings) = tensor
        .try_extract_strings()
        .map_err(|e| PluginError::Infer(format!("output '{name}': {e}")))?;
    Tensor::from_strings(dims, &strings)
        .map_err(|e| PluginError::Infer(format!("output '{name}': {e}")))
}

pub(super) fn ort_type(elem: ElemType) -> Option<TensorElementType> {
    TYPES.iter().find(|(e, _)| *e == elem.0).map(|(_, t)| *t)
}

pub(super) fn elem_type(t: TensorElementType) -> Option<ElemType> {
    TYPES
        .iter()
        .find(|(_, o)| *o == t)
        .map(|(e, _)| ElemType(*e))
}

/// A Tessera tensor as an onnxruntime tensor: one copy into a buffer
/// onnxruntime allocates (aligned as its kernels want; a tensor's bytes
/// that came off the network may sit at any offset).
pub(super) fn to_ort(t: &Tensor) -> Result<DynTensor, PluginError> {
    if t.elem() == ElemType::STRING {
        return strings_to_ort(t);
    }
    let ty = ort_type(t.elem()).ok_or_else(|| {
        PluginError::BadInput(format!("element type {} is not supported", t.elem()))
    })?;
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    let mut value = DynTensor::new(&Allocator::default(), ty, shape)
        .map_err(|e| PluginError::Infer(format!("cannot allocate an input: {e}")))?;
    let bytes = t.bytes();
    if value.size() != Some(bytes.len()) {
        return Err(PluginError::BadInput(format!(
            "a {} tensor of shape {:?} has {} bytes; onnxruntime expects {:?}",
            t.elem(),
            t.shape(),
            bytes.len(),
            value.size()
        )));
    }
    if !bytes.is_empty() {
        // SAFETY: the buffer was just allocated for `size()` == bytes.len()
        // bytes on the CPU and nothing else refers to it yet.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                value.data_ptr_mut().cast::<u8>(),
                bytes.len(),
            );
        }
    }
    Ok(value)
}

/// A Tessera tensor as an onnxruntime input over its own bytes, without a
/// copy, where its type is a plain number onnxruntime takes by pointer
/// (float32, int64, int32) and its bytes are aligned for it; `None`
/// otherwise (then [`to_ort`] copies). A decoder's kept cache (onnxruntime's
/// own output buffer of the step before) goes back in this way: the cache
/// is never copied between steps.
pub(super) fn view(t: &Tensor) -> Result<Option<SessionInputValue<'_>>, PluginError> {
    fn typed<T: PrimitiveTensorElementType + std::fmt::Debug>(
        t: &Tensor,
    ) -> Result<Option<SessionInputValue<'_>>, PluginError> {
        let bytes = t.bytes();
        let aligned = bytes.as_ptr().align_offset(std::mem::align_of::<T>()) == 0;
        if bytes.is_empty() || !aligned || bytes.len() % std::mem::size_of::<T>() != 0 {
            return Ok(None);
        }
        let info = MemoryInfo::new(
            AllocationDevice::CPU,
            0,
            AllocatorType::Device,
            MemoryType::Default,
        )
        .map_err(|e| PluginError::Infer(format!("onnxruntime memory info: {e}")))?;
        let shape = Shape::new(t.shape().iter().map(|&d| d as i64));
        // SAFETY: the pointer is to `bytes.len()` bytes of CPU memory,
        // aligned for `T`, which the shape fills exactly (a Tensor's length
        // matches its shape); the view borrows `t`, so it cannot outlive
        // them; onnxruntime only reads its inputs.
        let value = unsafe {
            TensorRefMut::<T>::from_raw(info, bytes.as_ptr() as *mut std::ffi::c_void, shape)
        }
        .map_err(|e| PluginError::BadInput(format!("an input over its own bytes: {e}")))?;
        Ok(Some(value.into()))
    }
    match t.elem() {
        ElemType::FLOAT => typed::<f32>(t),
        ElemType::INT64 => typed::<i64>(t),
        ElemType::INT32 => typed::<i32>(t),
        _ => Ok(None),
    }
}

/// An onnxruntime output tensor's buffer, owned by a `Bytes` (no copy).
struct OrtBytes {
    value: DynTensor,
    len: usize,
}

impl AsRef<[u8]> for OrtBytes {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the tensor lives as long as `self`, its CPU buffer holds
        // `len` bytes (checked when made) and is not written after the run.
        unsafe { std::slice::from_raw_parts(self.value.data_ptr().cast::<u8>(), self.len) }
    }
}

/// An onnxruntime output as a Tessera tensor, over onnxruntime's buffer.
pub(super) fn from_ort(name: &str, value: DynValue) -> Result<Tensor, PluginError> {
    let ValueType::Tensor { ty, shape, .. } = value.dtype().clone() else {
        return Err(PluginError::Infer(format!(
            "output '{name}' is a {}, not a tensor",
            value.dtype()
        )));
    };
    let elem = elem_type(ty).ok_or_else(|| {
        PluginError::Infer(format!(
            "output '{name}' is a {ty:?} tensor, which tensors here do not carry"
        ))
    })?;
    let dims: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| PluginError::Infer(format!("output '{name}' has a negative dim")))?;
    let tensor: DynTensor = value
        .downcast::<DynTensorValueType>()
        .map_err(|e| PluginError::Infer(format!("output '{name}': {e}")))?;
    if elem == ElemType::STRING {
        return strings_from_ort(name, &tensor, dims);
    }
    if !tensor.memory_info().is_cpu_accessible() {
        return Err(PluginError::Infer(format!(
            "output '{name}' is not in CPU memory"
        )));
    }
    let len = tensor
        .size()
        .ok_or_else(|| PluginError::Infer(format!("output '{name}' has no byte size")))?;
    let owner = OrtBytes { value: tensor, len };
    Tensor::new(elem, dims, bytes::Bytes::from_owner(owner))
        .map_err(|e| PluginError::Infer(format!("output '{name}': {e}")))
}

/// The spec of a session input or output (-1 dims are dynamic).
pub(super) fn spec(name: &str, ty: &ValueType) -> Option<TensorSpec> {
    let ValueType::Tensor { ty, shape, .. } = ty else {
        return None;
    };
    Some(TensorSpec {
        name: name.to_string(),
        elem: elem_type(*ty)?,
        shape: Some(shape.iter().map(|&d| usize::try_from(d).ok()).collect()),
        kind: crate::plugin::ValueKind::Tensor,
    })
}
