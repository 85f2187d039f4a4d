//! KServe v2 tensors: datatype names, JSON `data` (flat or nested) and the
//! binary tensor extension (`binary_data_size` inputs after the JSON
//! header; `binary_data` outputs), to and from [`Tensor`].

use serde_json::{Map, Value};
use tessera_common::graph::Dim;
use tessera_common::onnx::ElemType;
use tessera_common::tensor::Tensor;
use tessera_common::wire::routes::{Signature, TensorSig};

/// What is wrong with a request's tensor (an HTTP 400, gRPC
/// INVALID_ARGUMENT), or why an output cannot be sent as JSON.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CodecError {
    #[error("unknown input '{name}'; the model's inputs are: {}", inputs.join(", "))]
    UnknownInput { name: String, inputs: Vec<String> },
    #[error("input '{name}': unknown datatype '{datatype}'")]
    UnknownDatatype { name: String, datatype: String },
    #[error("input '{name}' is {model} in the model, got {datatype}")]
    WrongDatatype {
        name: String,
        model: &'static str,
        datatype: String,
    },
    #[error("binary_data_size must be a non-negative integer, got {0}")]
    BinarySize(String),
    #[error("input '{name}': shape {shape:?} has a negative dimension")]
    NegativeDim { name: String, shape: Vec<i64> },
    #[error("input '{name}': shape {shape:?} has more elements than can be addressed")]
    Unaddressable { name: String, shape: Vec<i64> },
    #[error("input '{name}': shape {shape:?} holds {want} elements, data has {got}")]
    Count {
        name: String,
        shape: Vec<usize>,
        want: usize,
        got: usize,
    },
    #[error("input '{name}': {value} is not a valid {datatype} value")]
    Value {
        name: String,
        value: String,
        datatype: &'static str,
    },
    /// The bytes do not make a tensor of the shape and type given.
    #[error("input '{name}': {reason}")]
    Tensor { name: String, reason: String },
    /// An output's bytes do not hold its strings.
    #[error("output: {0}")]
    Output(String),
    #[error("a BYTES element that is not UTF-8 cannot be sent as JSON (ask for binary_data)")]
    NotUtf8,
    #[error("{0} tensors cannot be sent as JSON")]
    NotJson(String),
    #[error("input '{0}' is given twice")]
    Twice(String),
    /// gRPC: `raw_input_contents` must be one per input or none.
    #[error("{raw} raw_input_contents for {inputs} inputs: give one per input, in order, or none")]
    RawCount { raw: usize, inputs: usize },
    #[error("input '{0}' has both contents and raw_input_contents")]
    BothContents(String),
    #[error("input '{0}' has neither contents nor raw_input_contents")]
    NoContents(String),
    #[error("input '{name}': {datatype} has no typed contents; send it in raw_input_contents")]
    NoTypedContents {
        name: String,
        datatype: &'static str,
    },
    #[error("timeout must be a positive int64 number of microseconds")]
    Timeout,
}

/// v2 datatype names and their ONNX element types.
const DATATYPES: [(&str, i32); 14] = [
    ("BOOL", 9),
    ("UINT8", 2),
    ("UINT16", 4),
    ("UINT32", 12),
    ("UINT64", 13),
    ("INT8", 3),
    ("INT16", 5),
    ("INT32", 6),
    ("INT64", 7),
    ("FP16", 10),
    ("FP32", 1),
    ("FP64", 11),
    ("BF16", 16),
    ("BYTES", 8),
];

/// The v2 name of an ONNX element type (`None`: no v2 name).
pub fn datatype(elem: ElemType) -> Option<&'static str> {
    DATATYPES
        .iter()
        .find(|(_, e)| *e == elem.0)
        .map(|(name, _)| *name)
}

/// The ONNX element type of a v2 datatype name.
pub fn elem_type(datatype: &str) -> Option<ElemType> {
    DATATYPES
        .iter()
        .find(|(name, _)| *name == datatype)
        .map(|(_, e)| ElemType(*e))
}

/// The element type of the model's input `name` sent as `datatype`: the
/// input must exist and (when the model types it) have that datatype.
pub fn input_elem(
    signature: &Signature,
    name: &str,
    datatype: &str,
) -> Result<ElemType, CodecError> {
    let spec = signature
        .input(name)
        .ok_or_else(|| CodecError::UnknownInput {
            name: name.into(),
            inputs: signature.inputs.iter().map(|t| t.name.clone()).collect(),
        })?;
    let elem = elem_type(datatype).ok_or_else(|| CodecError::UnknownDatatype {
        name: name.into(),
        datatype: datatype.into(),
    })?;
    if let Some(want) = spec.elem.map(ElemType).filter(|&e| e != elem) {
        return Err(CodecError::WrongDatatype {
            name: name.into(),
            model: datatype_name(want),
            datatype: datatype.into(),
        });
    }
    Ok(elem)
}

fn datatype_name(elem: ElemType) -> &'static str {
    datatype(elem).unwrap_or("?")
}

/// `[(name, datatype, shape)]` of model tensors, -1 for a dynamic dim
/// (`[-1]` when even the rank is unknown): what metadata answers.
pub fn metadata(tensors: &[TensorSig]) -> Vec<(String, &'static str, Vec<i64>)> {
    tensors
        .iter()
        .map(|t| {
            let shape: Vec<i64> = match &t.shape {
                Some(dims) => dims
                    .iter()
                    .map(|d| match d {
                        Dim::Known(n) => *n,
                        _ => -1,
                    })
                    .collect(),
                None => vec![-1],
            };
            let datatype = t.elem.map(ElemType).and_then(datatype).unwrap_or("UNKNOWN");
            (t.name.clone(), datatype, shape)
        })
        .collect()
}

/// The `binary_data_size` parameter, if given.
pub fn binary_size(parameters: Option<&Map<String, Value>>) -> Result<Option<usize>, CodecError> {
    match parameters.and_then(|p| p.get("binary_data_size")) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| CodecError::BinarySize(v.to_string())),
    }
}

/// `shape` as tensor dims: every dim ≥ 0, and an element count this
/// machine can address (a request's shape must not overflow it).
pub fn dims(name: &str, shape: &[i64]) -> Result<Vec<usize>, CodecError> {
    let dims: Vec<usize> = shape
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| CodecError::NegativeDim {
                name: name.into(),
                shape: shape.to_vec(),
            })
        })
        .collect::<Result<_, _>>()?;
    if dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .is_none()
    {
        return Err(CodecError::Unaddressable {
            name: name.into(),
            shape: shape.to_vec(),
        });
    }
    Ok(dims)
}

/// A tensor from raw little-endian bytes (the binary extension).
pub fn from_binary(
    name: &str,
    elem: ElemType,
    shape: Vec<usize>,
    bytes: bytes::Bytes,
) -> Result<Tensor, CodecError> {
    Tensor::new(elem, shape, bytes).map_err(|e| tensor_error(name, e))
}

/// Bytes that do not make a tensor of input `name`.
pub fn tensor_error(name: &str, reason: impl std::fmt::Display) -> CodecError {
    CodecError::Tensor {
        name: name.into(),
        reason: reason.to_string(),
    }
}

/// A tensor from JSON `data`, flat or nested in row-major order.
pub fn from_json(
    name: &str,
    elem: ElemType,
    shape: Vec<usize>,
    data: &Value,
) -> Result<Tensor, CodecError> {
    let mut flat = Vec::new();
    flatten(data, &mut flat);
    let want: usize = shape.iter().product();
    if flat.len() != want {
        return Err(CodecError::Count {
            name: name.into(),
            shape,
            want,
            got: flat.len(),
        });
    }
    let bad = |v: &Value| CodecError::Value {
        name: name.into(),
        value: v.to_string(),
        datatype: datatype_name(elem),
    };
    let mut bytes = Vec::with_capacity(want * elem.size_bytes().unwrap_or(1) as usize);
    for v in flat {
        encode_value(elem, v, &mut bytes).ok_or_else(|| bad(v))?;
    }
    Tensor::new(elem, shape, bytes).map_err(|e| tensor_error(name, e))
}

fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        other => out.push(other),
    }
}

/// Appends one JSON value as `elem`'s little-endian bytes; `None` if it
/// is not a value of that type (or out of its range).
fn encode_value(elem: ElemType, v: &Value, out: &mut Vec<u8>) -> Option<()> {
    macro_rules! int {
        ($t:ty) => {{
            let x: $t = if let Some(i) = v.as_i64() {
                <$t>::try_from(i).ok()?
            } else {
                <$t>::try_from(v.as_u64()?).ok()?
            };
            out.extend_from_slice(&x.to_le_bytes());
        }};
    }
    match elem {
        ElemType::BOOL => out.push(u8::from(v.as_bool()?)),
        ElemType::UINT8 => int!(u8),
        ElemType::UINT16 => int!(u16),
        ElemType::UINT32 => int!(u32),
        ElemType::UINT64 => int!(u64),
        ElemType::INT8 => int!(i8),
        ElemType::INT16 => int!(i16),
        ElemType::INT32 => int!(i32),
        ElemType::INT64 => int!(i64),
        ElemType::FLOAT16 => out.extend_from_slice(&half::f16::from_f64(v.as_f64()?).to_le_bytes()),
        ElemType::BFLOAT16 => {
            out.extend_from_slice(&half::bf16::from_f64(v.as_f64()?).to_le_bytes())
        }
        ElemType::FLOAT => out.extend_from_slice(&(v.as_f64()? as f32).to_le_bytes()),
        ElemType::DOUBLE => out.extend_from_slice(&v.as_f64()?.to_le_bytes()),
        // BYTES: the v2 binary layout, which is also a string tensor's
        // (a u32 LE length, then the bytes).
        ElemType::STRING => {
            let text = v.as_str()?.as_bytes();
            out.extend_from_slice(&u32::try_from(text.len()).ok()?.to_le_bytes());
            out.extend_from_slice(text);
        }
        _ => return None,
    }
    Some(())
}

/// A tensor's elements as a flat JSON array.
pub fn to_json(t: &Tensor) -> Result<Value, CodecError> {
    let b = t.bytes();
    macro_rules! each {
        ($n:expr, $f:expr) => {
            b.chunks_exact($n).map($f).collect::<Vec<Value>>()
        };
    }
    let values = match t.elem() {
        ElemType::BOOL => each!(1, |c| Value::Bool(c[0] != 0)),
        ElemType::UINT8 => each!(1, |c| Value::from(c[0])),
        ElemType::INT8 => each!(1, |c| Value::from(c[0] as i8)),
        ElemType::UINT16 => each!(2, |c| Value::from(u16::from_le_bytes([c[0], c[1]]))),
        ElemType::INT16 => each!(2, |c| Value::from(i16::from_le_bytes([c[0], c[1]]))),
        ElemType::INT32 => each!(4, |c| Value::from(i32::from_le_bytes([
            c[0], c[1], c[2], c[3]
        ]))),
        ElemType::UINT32 => each!(4, |c| Value::from(u32::from_le_bytes([
            c[0], c[1], c[2], c[3]
        ]))),
        ElemType::INT64 => each!(8, |c| Value::from(i64::from_le_bytes(eight(c)))),
        ElemType::UINT64 => each!(8, |c| Value::from(u64::from_le_bytes(eight(c)))),
        ElemType::FLOAT => each!(4, |c| float(
            f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64
        )),
        ElemType::DOUBLE => each!(8, |c| float(f64::from_le_bytes(eight(c)))),
        ElemType::FLOAT16 => each!(2, |c| float(
            half::f16::from_le_bytes([c[0], c[1]]).to_f64()
        )),
        ElemType::BFLOAT16 => each!(2, |c| float(
            half::bf16::from_le_bytes([c[0], c[1]]).to_f64()
        )),
        ElemType::STRING => t
            .strings()
            .map_err(|e| CodecError::Output(e.to_string()))?
            .into_iter()
            .map(|s| match std::str::from_utf8(s) {
                Ok(text) => Ok(Value::from(text)),
                Err(_) => Err(CodecError::NotUtf8),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(CodecError::NotJson(t.elem().to_string())),
    };
    Ok(Value::Array(values))
}

fn eight(c: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(c);
    a
}

/// A float as JSON (NaN and infinities, which JSON cannot hold, as null).
fn float(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nested_and_flat_json_give_the_same_tensor() {
        let flat = from_json(
            "x",
            ElemType::FLOAT,
            vec![2, 2],
            &json!([1.0, 2.0, 3.5, -4.0]),
        )
        .unwrap();
        let nested = from_json(
            "x",
            ElemType::FLOAT,
            vec![2, 2],
            &json!([[1.0, 2.0], [3.5, -4.0]]),
        )
        .unwrap();
        assert_eq!(flat, nested);
        assert_eq!(flat.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.5, -4.0]);
        assert_eq!(to_json(&flat).unwrap(), json!([1.0, 2.0, 3.5, -4.0]));
    }

    #[test]
    fn every_datatype_round_trips_through_json() {
        let cases = [
            ("BOOL", json!([true, false])),
            ("UINT8", json!([0, 255])),
            ("UINT16", json!([0, 65535])),
            ("UINT32", json!([0, 4294967295u64])),
            ("UINT64", json!([0, u64::MAX])),
            ("INT8", json!([-128, 127])),
            ("INT16", json!([-32768, 32767])),
            ("INT32", json!([i32::MIN, i32::MAX])),
            ("INT64", json!([i64::MIN, i64::MAX])),
            ("FP16", json!([0.5, -2.0])),
            ("BF16", json!([0.5, -2.0])),
            ("FP32", json!([0.25, -1.5])),
            ("FP64", json!([0.1, -1e300])),
        ];
        for (dt, data) in cases {
            let elem = elem_type(dt).unwrap();
            assert_eq!(datatype(elem), Some(dt));
            let t = from_json("x", elem, vec![2], &data).unwrap();
            assert_eq!(to_json(&t).unwrap(), data, "{dt}");
        }
    }

    #[test]
    fn bad_values_and_lengths_are_clear_errors() {
        let e = from_json("ids", ElemType::INT64, vec![3], &json!([1, 2])).unwrap_err();
        assert!(
            matches!(
                e,
                CodecError::Count {
                    want: 3,
                    got: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("holds 3 elements, data has 2"),
            "{e}"
        );
        let value = |e: CodecError| match e {
            CodecError::Value { datatype, .. } => datatype,
            other => panic!("not a value error: {other}"),
        };
        let e = from_json("ids", ElemType::INT64, vec![1], &json!([1.5])).unwrap_err();
        assert!(e.to_string().contains("not a valid INT64"), "{e}");
        assert_eq!(value(e), "INT64");
        let e = from_json("b", ElemType::UINT8, vec![1], &json!([256])).unwrap_err();
        assert_eq!(value(e), "UINT8");
        let e = from_json("s", ElemType::STRING, vec![1], &json!([1])).unwrap_err();
        assert_eq!(value(e), "BYTES");
        let s = from_json("s", ElemType::STRING, vec![2], &json!(["a", "héllo"])).unwrap();
        assert_eq!(to_json(&s).unwrap(), json!(["a", "héllo"]));
        // The v2 binary layout of BYTES is the tensor's own.
        let b = from_binary("s", ElemType::STRING, vec![2], s.shared_bytes()).unwrap();
        assert_eq!(b, s);
        assert!(from_binary("s", ElemType::STRING, vec![2], vec![1, 0, 0].into()).is_err());
        let e = from_binary("x", ElemType::FLOAT, vec![2], vec![0u8; 7].into()).unwrap_err();
        assert!(e.to_string().contains("needs 8 bytes, got 7"), "{e}");
        assert!(dims("x", &[1, -1]).is_err());
        // 2^62 × 2^62 elements: refused, not overflowed.
        let e = dims("x", &[1 << 62, 1 << 62]).unwrap_err();
        assert!(matches!(e, CodecError::Unaddressable { .. }), "{e}");
        assert_eq!(dims("x", &[0, 1 << 62, 1 << 62]).unwrap().len(), 3);
        assert!(binary_size(json!({"binary_data_size": -3}).as_object()).is_err());
        assert_eq!(
            binary_size(json!({"binary_data_size": 8}).as_object()),
            Ok(Some(8))
        );
    }

    #[test]
    fn non_finite_floats_are_null_in_json() {
        let t = Tensor::from_values(vec![2], &[f32::NAN, 1.0]).unwrap();
        assert_eq!(to_json(&t).unwrap(), json!([null, 1.0]));
    }
}
