//! ONNX model I/O on our own prost types, generated at build time from the
//! vendored upstream `proto/onnx-ml.proto` (a superset of `onnx.proto`), so
//! a decode → encode round trip keeps every field the standard defines.

pub mod attr;
pub mod bones;
pub mod external;
mod io;
pub mod parts;
pub mod skeleton;

pub use io::{
    decode_model, decode_model_shared, encode_model, load_model, load_model_with_base_dir,
    read_generation_spec, save_model, ExternalDataPolicy, FolderError,
};

/// Types generated from the upstream `onnx-ml.proto`.
#[allow(clippy::all, missing_docs, rustdoc::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

use proto::tensor_proto::DataType;

/// Errors from reading, writing or interpreting ONNX models.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a valid ONNX model ({len} bytes): {source}")]
    Decode {
        len: usize,
        #[source]
        source: prost::DecodeError,
    },
    #[error("not a valid ONNX model: {0}")]
    Invalid(String),
    #[error("external data of tensor '{tensor}': {message}")]
    ExternalData { tensor: String, message: String },
    /// A tensor's external data file cannot be read.
    #[error("external data of tensor '{tensor}': cannot read {}: {source}", path.display())]
    ExternalDataRead {
        tensor: String,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The element type of a tensor, as the ONNX `TensorProto.DataType` number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ElemType(pub i32);

impl ElemType {
    pub const UNDEFINED: ElemType = ElemType(DataType::Undefined as i32);
    pub const FLOAT: ElemType = ElemType(DataType::Float as i32);
    pub const UINT8: ElemType = ElemType(DataType::Uint8 as i32);
    pub const INT8: ElemType = ElemType(DataType::Int8 as i32);
    pub const UINT16: ElemType = ElemType(DataType::Uint16 as i32);
    pub const INT16: ElemType = ElemType(DataType::Int16 as i32);
    pub const INT32: ElemType = ElemType(DataType::Int32 as i32);
    pub const INT64: ElemType = ElemType(DataType::Int64 as i32);
    pub const STRING: ElemType = ElemType(DataType::String as i32);
    pub const BOOL: ElemType = ElemType(DataType::Bool as i32);
    pub const FLOAT16: ElemType = ElemType(DataType::Float16 as i32);
    pub const DOUBLE: ElemType = ElemType(DataType::Double as i32);
    pub const UINT32: ElemType = ElemType(DataType::Uint32 as i32);
    pub const UINT64: ElemType = ElemType(DataType::Uint64 as i32);
    pub const BFLOAT16: ElemType = ElemType(DataType::Bfloat16 as i32);
    pub const FLOAT8E4M3FN: ElemType = ElemType(DataType::Float8e4m3fn as i32);
    pub const FLOAT8E4M3FNUZ: ElemType = ElemType(DataType::Float8e4m3fnuz as i32);
    pub const FLOAT8E5M2: ElemType = ElemType(DataType::Float8e5m2 as i32);
    pub const FLOAT8E5M2FNUZ: ElemType = ElemType(DataType::Float8e5m2fnuz as i32);
    pub const UINT4: ElemType = ElemType(DataType::Uint4 as i32);
    pub const INT4: ElemType = ElemType(DataType::Int4 as i32);

    /// The types Tessera's tensors compute with: every fixed-size real
    /// numeric type and bool, in ONNX number order.
    pub const NUMERIC: &'static [ElemType] = &[
        ElemType::FLOAT,
        ElemType::UINT8,
        ElemType::INT8,
        ElemType::UINT16,
        ElemType::INT16,
        ElemType::INT32,
        ElemType::INT64,
        ElemType::BOOL,
        ElemType::FLOAT16,
        ElemType::DOUBLE,
        ElemType::UINT32,
        ElemType::UINT64,
        ElemType::BFLOAT16,
    ];

    /// Bytes per element (sub-byte types round up to one byte); `None` for
    /// strings and undefined types.
    pub fn size_bytes(self) -> Option<u64> {
        use DataType::*;
        Some(match DataType::try_from(self.0).ok()? {
            Float | Int32 | Uint32 => 4,
            Double | Int64 | Uint64 | Complex64 => 8,
            Complex128 => 16,
            Int16 | Uint16 | Float16 | Bfloat16 => 2,
            Int8 | Uint8 | Bool | Float8e4m3fn | Float8e4m3fnuz | Float8e5m2 | Float8e5m2fnuz
            | Float8e8m0 | Uint4 | Int4 | Float4e2m1 | Uint2 | Int2 | Float6e2m3 | Float6e3m2 => 1,
            String | Undefined => return None,
        })
    }

    /// Bytes that `numel` elements take in a tensor's data: packed for
    /// the 4- and 2-bit types (two or four to a byte, low bits first, as
    /// ONNX and onnxruntime store them); `None` for strings (their length
    /// is their content's), the 6-bit float types and undefined types.
    pub fn data_len(self, numel: u64) -> Option<u64> {
        use DataType::*;
        match DataType::try_from(self.0).ok()? {
            Uint4 | Int4 | Float4e2m1 => Some(numel.div_ceil(2)),
            Uint2 | Int2 => Some(numel.div_ceil(4)),
            Float6e2m3 | Float6e3m2 => None,
            _ => numel.checked_mul(self.size_bytes()?),
        }
    }

    /// Whether each element takes whole bytes of its own (not strings,
    /// not the packed sub-byte types).
    pub fn is_byte_aligned(self) -> bool {
        matches!(self.size_bytes(), Some(s) if self.data_len(2) == Some(2 * s))
    }

    /// Upstream name, e.g. `FLOAT`.
    pub fn name(self) -> String {
        DataType::try_from(self.0)
            .map(|d| d.as_str_name().to_string())
            .unwrap_or_else(|_| format!("DATATYPE_{}", self.0))
    }
}

impl std::fmt::Display for ElemType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name().to_lowercase())
    }
}

/// A `ValueInfoProto` for a sequence of tensors of element type
/// `elem_type` (shapes unknown).
pub fn sequence_info(name: &str, elem_type: i32) -> proto::ValueInfoProto {
    use proto::type_proto::{Sequence, Value};
    container_info(name, elem_type, |t| {
        Value::SequenceType(Box::new(Sequence { elem_type: Some(t) }))
    })
}

/// A `ValueInfoProto` for an optional tensor of element type `elem_type`
/// (shape unknown).
pub fn optional_info(name: &str, elem_type: i32) -> proto::ValueInfoProto {
    use proto::type_proto::{Optional, Value};
    container_info(name, elem_type, |t| {
        Value::OptionalType(Box::new(Optional { elem_type: Some(t) }))
    })
}

fn container_info(
    name: &str,
    elem_type: i32,
    wrap: impl FnOnce(Box<proto::TypeProto>) -> proto::type_proto::Value,
) -> proto::ValueInfoProto {
    use proto::type_proto::{Tensor, Value};
    let tensor = proto::TypeProto {
        denotation: None,
        value: Some(Value::TensorType(Tensor {
            elem_type: Some(elem_type),
            shape: None,
        })),
    };
    proto::ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(proto::TypeProto {
            denotation: None,
            value: Some(wrap(Box::new(tensor))),
        }),
        ..Default::default()
    }
}

/// A `ValueInfoProto` for a tensor of element type `elem_type` (the ONNX
/// number) and static `dims`.
pub fn tensor_info(name: &str, elem_type: i32, dims: &[i64]) -> proto::ValueInfoProto {
    use proto::tensor_shape_proto::{dimension, Dimension};
    let dim = dims
        .iter()
        .map(|&d| Dimension {
            denotation: None,
            value: Some(dimension::Value::DimValue(d)),
        })
        .collect();
    proto::ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(proto::TypeProto {
            denotation: None,
            value: Some(proto::type_proto::Value::TensorType(
                proto::type_proto::Tensor {
                    elem_type: Some(elem_type),
                    shape: Some(proto::TensorShapeProto { dim }),
                },
            )),
        }),
        ..Default::default()
    }
}
