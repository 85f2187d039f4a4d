//! `ModelInfer`: a KServe v2 gRPC inference request. Inputs come as
//! `raw_input_contents` (each input's little-endian bytes, in input order:
//! what Triton's clients send, shared with the request buffer, not copied)
//! or typed `contents`; outputs go back as `raw_output_contents`, as
//! Triton answers. A deadline comes from the `timeout` parameter (µs) or
//! the call's `grpc-timeout`, whichever is sooner.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tessera_common::onnx::ElemType;
use tessera_common::tensor::{Element, Tensor};
use tessera_common::wire::routes::Signature;
use tonic::{Request, Status};

use super::proto::{self, infer_parameter::ParameterChoice, InferTensorContents};
use super::status;
use crate::core::{check_output, check_version, VERSION};
use crate::http::tensors::{self, CodecError};
use crate::Door;

pub async fn run(
    door: &Arc<Door>,
    request: Request<proto::ModelInferRequest>,
) -> Result<proto::ModelInferResponse, Status> {
    let call_deadline = grpc_timeout(request.metadata());
    let mut r = request.into_inner();
    check_version(&r.model_name, Some(&r.model_version)).map_err(status)?;
    let table = door.table(&r.model_name).await.map_err(status)?;
    let raw = std::mem::take(&mut r.raw_input_contents);
    let inputs = std::mem::take(&mut r.inputs);
    let typed: usize = inputs.iter().map(|i| typed_len(i.contents.as_ref())).sum();
    let decoded = if typed > crate::core::OFF_ASYNC_BYTES {
        let table = table.clone();
        tokio::task::spawn_blocking(move || decode(&table.signature, inputs, raw))
            .await
            .map_err(|e| Status::internal(format!("request decoding: {e}")))?
    } else {
        decode(&table.signature, inputs, raw)
    };
    let deadline = timeout(&r.parameters).map(|t| match (t, call_deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    });
    let (inputs, deadline) = match decoded.and_then(|i| Ok((i, deadline?))) {
        Ok(d) => d,
        Err(e) => {
            // Refused before it reached the cluster: counted here.
            door.metrics.failed(&r.model_name, "bad_input");
            return Err(Status::invalid_argument(e.to_string()));
        }
    };
    for o in &r.outputs {
        if let Err(e) = check_output(&o.name, o.parameters.keys().map(String::as_str)) {
            door.metrics.failed(&r.model_name, "bad_input");
            return Err(status(e));
        }
    }
    let wanted: Vec<String> = r.outputs.iter().map(|o| o.name.clone()).collect();
    let outputs = door
        .infer(&r.model_name, inputs, &wanted, deadline)
        .await
        .map_err(status)?;
    respond(r, outputs)
}

/// The request's tensors, checked against the model's inputs.
fn decode(
    signature: &Signature,
    inputs: Vec<proto::model_infer_request::InferInputTensor>,
    raw: Vec<bytes::Bytes>,
) -> Result<HashMap<String, Tensor>, CodecError> {
    if !raw.is_empty() && raw.len() != inputs.len() {
        return Err(CodecError::RawCount {
            raw: raw.len(),
            inputs: inputs.len(),
        });
    }
    let mut raw = raw.into_iter();
    let mut tensors = HashMap::with_capacity(inputs.len());
    for input in inputs {
        let name = input.name;
        let elem = tensors::input_elem(signature, &name, &input.datatype)?;
        let shape = tensors::dims(&name, &input.shape)?;
        let tensor = match (raw.next(), input.contents) {
            (Some(_), Some(_)) => return Err(CodecError::BothContents(name)),
            (Some(bytes), None) => tensors::from_binary(&name, elem, shape, bytes)?,
            (None, Some(contents)) => from_contents(&name, elem, shape, &contents)?,
            (None, None) => return Err(CodecError::NoContents(name)),
        };
        if tensors.insert(name.clone(), tensor).is_some() {
            return Err(CodecError::Twice(name));
        }
    }
    Ok(tensors)
}

fn typed_len(c: Option<&InferTensorContents>) -> usize {
    c.map_or(0, |c| {
        c.bool_contents.len()
            + c.int_contents.len()
            + c.int64_contents.len()
            + c.uint_contents.len()
            + c.uint64_contents.len()
            + c.fp32_contents.len()
            + c.fp64_contents.len()
            + c.bytes_contents.len()
    })
}

/// A tensor from typed contents: the field of its datatype, each value in
/// that datatype's range.
fn from_contents(
    name: &str,
    elem: ElemType,
    shape: Vec<usize>,
    c: &InferTensorContents,
) -> Result<Tensor, CodecError> {
    let dt = tensors::datatype(elem).unwrap_or("?");
    // The narrow integer types come in a wider field: each value checked.
    fn narrow<S, T>(values: &[S], name: &str, datatype: &'static str) -> Result<Vec<T>, CodecError>
    where
        S: Copy + std::fmt::Display,
        T: TryFrom<S>,
    {
        values
            .iter()
            .map(|&v| {
                T::try_from(v).map_err(|_| CodecError::Value {
                    name: name.into(),
                    value: v.to_string(),
                    datatype,
                })
            })
            .collect()
    }
    match elem {
        ElemType::BOOL => typed(name, shape, &c.bool_contents),
        ElemType::INT8 => typed(name, shape, &narrow::<_, i8>(&c.int_contents, name, dt)?),
        ElemType::INT16 => typed(name, shape, &narrow::<_, i16>(&c.int_contents, name, dt)?),
        ElemType::INT32 => typed(name, shape, &c.int_contents),
        ElemType::INT64 => typed(name, shape, &c.int64_contents),
        ElemType::UINT8 => typed(name, shape, &narrow::<_, u8>(&c.uint_contents, name, dt)?),
        ElemType::UINT16 => typed(name, shape, &narrow::<_, u16>(&c.uint_contents, name, dt)?),
        ElemType::UINT32 => typed(name, shape, &c.uint_contents),
        ElemType::UINT64 => typed(name, shape, &c.uint64_contents),
        ElemType::FLOAT => typed(name, shape, &c.fp32_contents),
        ElemType::DOUBLE => typed(name, shape, &c.fp64_contents),
        ElemType::STRING => {
            let strings = &c.bytes_contents;
            check_count(name, &shape, strings.len())?;
            Tensor::from_strings(shape, strings).map_err(|e| CodecError::Tensor {
                name: name.into(),
                reason: e.to_string(),
            })
        }
        _ => Err(CodecError::NoTypedContents {
            name: name.into(),
            datatype: dt,
        }),
    }
}

/// A tensor of `values`, as many as `shape` holds.
fn typed<T: Element>(name: &str, shape: Vec<usize>, values: &[T]) -> Result<Tensor, CodecError> {
    check_count(name, &shape, values.len())?;
    Tensor::from_values(shape, values).map_err(|e| CodecError::Tensor {
        name: name.into(),
        reason: e.to_string(),
    })
}

fn check_count(name: &str, shape: &[usize], count: usize) -> Result<(), CodecError> {
    let want: usize = shape.iter().product();
    if count == want {
        Ok(())
    } else {
        Err(CodecError::Count {
            name: name.into(),
            shape: shape.to_vec(),
            want,
            got: count,
        })
    }
}

/// The request's `timeout` parameter (µs, as Triton's clients send it).
fn timeout(
    parameters: &HashMap<String, proto::InferParameter>,
) -> Result<Option<Duration>, CodecError> {
    let Some(p) = parameters.get("timeout") else {
        return Ok(None);
    };
    match p.parameter_choice {
        Some(ParameterChoice::Int64Param(us)) if us > 0 => {
            Ok(Some(Duration::from_micros(us.unsigned_abs())))
        }
        Some(ParameterChoice::Uint64Param(us)) if us > 0 => Ok(Some(Duration::from_micros(us))),
        _ => Err(CodecError::Timeout),
    }
}

/// The call's own deadline: `grpc-timeout` (`<digits><unit>`, unit one of
/// H M S m u n), if sent and well formed.
fn grpc_timeout(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let text = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The answer: the outputs (those asked, in their order, or all), as raw
/// contents.
fn respond(
    r: proto::ModelInferRequest,
    wanted: Vec<(String, Tensor)>,
) -> Result<proto::ModelInferResponse, Status> {
    let mut described = Vec::with_capacity(wanted.len());
    let mut raw = Vec::with_capacity(wanted.len());
    for (name, t) in wanted {
        let datatype = tensors::datatype(t.elem()).ok_or_else(|| {
            Status::internal(format!(
                "output '{name}' is {}, which has no v2 datatype",
                t.elem()
            ))
        })?;
        described.push(proto::model_infer_response::InferOutputTensor {
            name,
            datatype: datatype.into(),
            shape: t.shape().iter().map(|&d| d as i64).collect(),
            parameters: HashMap::new(),
            contents: None,
        });
        raw.push(t.shared_bytes());
    }
    Ok(proto::ModelInferResponse {
        model_name: r.model_name,
        model_version: VERSION.into(),
        id: r.id,
        parameters: HashMap::new(),
        outputs: described,
        raw_output_contents: raw,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_contents_become_tensors_with_range_checks() {
        let c = InferTensorContents {
            int_contents: vec![1, -2, 127],
            ..Default::default()
        };
        let t = from_contents("x", ElemType::INT8, vec![3], &c).unwrap();
        assert_eq!(t.bytes(), &[1u8, 0xfe, 127]);
        let c = InferTensorContents {
            int_contents: vec![128],
            ..Default::default()
        };
        let e = from_contents("x", ElemType::INT8, vec![1], &c).unwrap_err();
        assert!(
            matches!(&e, CodecError::Value { value, datatype: "INT8", .. } if value == "128"),
            "{e}"
        );
        let c = InferTensorContents {
            fp32_contents: vec![1.5, 2.0],
            ..Default::default()
        };
        let e = from_contents("x", ElemType::FLOAT, vec![3], &c).unwrap_err();
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
        let e = from_contents("x", ElemType::FLOAT16, vec![2], &c).unwrap_err();
        assert!(
            matches!(
                e,
                CodecError::NoTypedContents {
                    datatype: "FP16",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("raw_input_contents"), "{e}");
        let c = InferTensorContents {
            bytes_contents: vec![b"ab".to_vec(), b"".to_vec()],
            ..Default::default()
        };
        let t = from_contents("s", ElemType::STRING, vec![2], &c).unwrap();
        assert_eq!(t.strings().unwrap(), vec![&b"ab"[..], &b""[..]]);
    }

    #[test]
    fn grpc_timeouts_parse() {
        let mut m = tonic::metadata::MetadataMap::new();
        assert_eq!(grpc_timeout(&m), None);
        m.insert("grpc-timeout", "250m".parse().unwrap());
        assert_eq!(grpc_timeout(&m), Some(Duration::from_millis(250)));
        m.insert("grpc-timeout", "3S".parse().unwrap());
        assert_eq!(grpc_timeout(&m), Some(Duration::from_secs(3)));
        m.insert("grpc-timeout", "x".parse().unwrap());
        assert_eq!(grpc_timeout(&m), None);
    }
}
