//! Values that are not single tensors: ONNX sequences of tensors and
//! optionals (a tensor, a sequence, or nothing). Models carry them between
//! the sequence ops (SplitToSequence, SequenceInsert, SequenceMap, Loop
//! scan outputs) and the optional ops; a graph may take or return them.
//!
//! ```
//! use tessera_common::onnx::ElemType;
//! use tessera_common::tensor::{Tensor, Value};
//!
//! let t = Tensor::from_values(vec![2], &[1.0f32, 2.0]).unwrap();
//! let seq = Value::sequence(ElemType::FLOAT, vec![t.clone(), t]);
//! assert_eq!(seq.to_string(), "sequence of 2 float tensors");
//! assert_eq!(Value::Optional(None).to_string(), "an empty optional");
//! ```

use crate::onnx::proto::{OptionalProto, SequenceProto};
use crate::onnx::ElemType;

use super::{Tensor, TensorError};

/// A value of an ONNX graph: a tensor, a sequence of tensors or an optional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Tensor(Tensor),
    /// Tensors of one element type (`elem`, also for an empty sequence).
    Sequence {
        elem: ElemType,
        items: Vec<Tensor>,
    },
    /// An optional: `None` is the empty optional.
    Optional(Option<Box<Value>>),
}

/// `SequenceProto.DataType` / `OptionalProto.DataType` numbers.
const PROTO_TENSOR: i32 = 1;
const PROTO_SEQUENCE: i32 = 3;

impl Value {
    /// A sequence of `items`, all of element type `elem`.
    pub fn sequence(elem: ElemType, items: Vec<Tensor>) -> Value {
        Value::Sequence { elem, items }
    }

    /// The tensor, if this is one.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// Reads a `SequenceProto` of tensors; `elem` types an empty one.
    pub fn from_sequence_proto(p: &SequenceProto, elem: ElemType) -> Result<Value, TensorError> {
        let kind = p.elem_type.unwrap_or(PROTO_TENSOR);
        if kind != PROTO_TENSOR && !(kind == 0 && p.tensor_values.is_empty()) {
            return Err(TensorError::UnsupportedType(format!(
                "a sequence of element kind {kind} (only sequences of tensors are carried)"
            )));
        }
        let items = p
            .tensor_values
            .iter()
            .map(Tensor::from_proto)
            .collect::<Result<Vec<_>, _>>()?;
        let elem = items.first().map_or(elem, Tensor::elem);
        if let Some(odd) = items.iter().find(|t| t.elem() != elem) {
            return Err(TensorError::WrongType {
                actual: odd.elem().name(),
                requested: elem.name(),
            });
        }
        Ok(Value::Sequence { elem, items })
    }

    /// Reads an `OptionalProto` of a tensor or a sequence of tensors;
    /// `elem` types an empty sequence inside.
    pub fn from_optional_proto(p: &OptionalProto, elem: ElemType) -> Result<Value, TensorError> {
        let inner = match (p.elem_type.unwrap_or(0), &p.tensor_value, &p.sequence_value) {
            (PROTO_TENSOR, Some(t), _) => Some(Value::Tensor(Tensor::from_proto(t)?)),
            (PROTO_SEQUENCE, _, Some(s)) => Some(Value::from_sequence_proto(s, elem)?),
            (PROTO_TENSOR | PROTO_SEQUENCE | 0, None, None) => None,
            (kind, _, _) => {
                return Err(TensorError::UnsupportedType(format!(
                    "an optional of element kind {kind} (only tensors and sequences of \
                     tensors are carried)"
                )))
            }
        };
        Ok(Value::Optional(inner.map(Box::new)))
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Value {
        Value::Tensor(t)
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Tensor(t) => write!(f, "{} tensor {:?}", t.elem(), t.shape()),
            Value::Sequence { elem, items } => {
                write!(f, "sequence of {} {elem} tensors", items.len())
            }
            Value::Optional(None) => f.write_str("an empty optional"),
            Value::Optional(Some(v)) => write!(f, "an optional holding a {v}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto(t: &Tensor) -> crate::onnx::proto::TensorProto {
        t.to_proto("t")
    }

    #[test]
    fn sequences_and_optionals_read_from_their_protos() {
        let a = Tensor::from_values(vec![2], &[1.0f32, 2.0]).unwrap();
        let b = Tensor::from_values(vec![1], &[3.0f32]).unwrap();
        let seq = SequenceProto {
            elem_type: Some(PROTO_TENSOR),
            tensor_values: vec![proto(&a), proto(&b)],
            ..Default::default()
        };
        let got = Value::from_sequence_proto(&seq, ElemType::FLOAT).unwrap();
        assert_eq!(got, Value::sequence(ElemType::FLOAT, vec![a.clone(), b]));

        let empty = SequenceProto {
            elem_type: Some(PROTO_TENSOR),
            ..Default::default()
        };
        let got = Value::from_sequence_proto(&empty, ElemType::INT64).unwrap();
        assert_eq!(got, Value::sequence(ElemType::INT64, vec![]));

        let some = OptionalProto {
            elem_type: Some(PROTO_TENSOR),
            tensor_value: Some(proto(&a)),
            ..Default::default()
        };
        let got = Value::from_optional_proto(&some, ElemType::FLOAT).unwrap();
        assert_eq!(got, Value::Optional(Some(Box::new(Value::Tensor(a)))));
        let none = OptionalProto {
            elem_type: Some(PROTO_TENSOR),
            ..Default::default()
        };
        assert_eq!(
            Value::from_optional_proto(&none, ElemType::FLOAT).unwrap(),
            Value::Optional(None)
        );
    }

    #[test]
    fn mixed_or_nested_sequences_are_refused() {
        let a = Tensor::from_values(vec![1], &[1.0f32]).unwrap();
        let b = Tensor::from_values(vec![1], &[1i64]).unwrap();
        let mixed = SequenceProto {
            elem_type: Some(PROTO_TENSOR),
            tensor_values: vec![proto(&a), proto(&b)],
            ..Default::default()
        };
        assert!(Value::from_sequence_proto(&mixed, ElemType::FLOAT).is_err());
        let nested = SequenceProto {
            elem_type: Some(PROTO_SEQUENCE),
            sequence_values: vec![SequenceProto::default()],
            ..Default::default()
        };
        assert!(Value::from_sequence_proto(&nested, ElemType::FLOAT).is_err());
    }
}
