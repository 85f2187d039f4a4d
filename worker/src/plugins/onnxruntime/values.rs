//! Sequences and optionals through onnxruntime.
//!
//! onnxruntime takes a sequence input as a sequence value, an optional
//! input as what it holds, and an input left out as the empty optional.
//! Two things its API cannot do are worked around on the model, exactly:
//!
//! - its C API makes no empty sequence, so a request with an empty
//!   sequence input runs a variant of the model in which a `SequenceEmpty`
//!   node (wrapped in `Optional` for an optional input) makes that input;
//! - the ort crate cannot hand back an empty optional output, so every
//!   optional graph output `o` is returned as two plain ones: `o`'s
//!   contents (an empty tensor or sequence when it holds nothing) and a
//!   bool that says whether it holds something (`OptionalHasElement`).

use ort::session::SessionInputValue;
use ort::value::{DynSequenceValueType, DynTensorValueType, DynValue, Sequence, ValueType};
use tessera_common::onnx::proto::{
    attribute_proto::AttributeType, type_proto, AttributeProto, GraphProto, ModelProto, NodeProto,
    TensorProto, TypeProto, ValueInfoProto,
};
use tessera_common::onnx::ElemType;
use tessera_common::tensor::{Tensor, Value};

use super::convert;
use crate::plugin::{PluginError, TensorSpec, ValueKind};

/// An optional graph output, returned as its contents and a flag.
#[derive(Debug, Clone)]
pub(super) struct OptionalOutput {
    /// Its position among the graph's outputs (the contents take it).
    pub index: usize,
    /// The name of the bool output that says whether it holds something.
    pub has: String,
}

/// The kind of a session input or output, and the spec of its tensors.
pub(super) fn spec(name: &str, ty: &ValueType) -> Option<TensorSpec> {
    let (kind, tensor) = match ty {
        ValueType::Tensor { .. } => (ValueKind::Tensor, ty),
        ValueType::Sequence(inner) => (ValueKind::Sequence, inner.as_ref()),
        ValueType::Optional(inner) => match inner.as_ref() {
            ValueType::Sequence(t) => (ValueKind::OptionalSequence, t.as_ref()),
            t => (ValueKind::OptionalTensor, t),
        },
        _ => return None,
    };
    let mut spec = convert::spec(name, tensor)?;
    if kind != ValueKind::Tensor {
        // onnxruntime types the tensors of a sequence or optional without
        // a shape (reported as rank 0): their shapes are unknown.
        spec.shape = None;
    }
    spec.kind = kind;
    Some(spec)
}

fn node(op: &str, inputs: &[&str], outputs: &[&str], attributes: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(format!(
            "tessera:{}",
            outputs.first().copied().unwrap_or(op)
        )),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attributes,
        ..Default::default()
    }
}

fn int_attribute(name: &str, value: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(value),
        ..Default::default()
    }
}

fn info(name: &str, ty: TypeProto) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(ty),
        ..Default::default()
    }
}

/// A tensor type of element `elem`, shape unknown.
fn tensor_type(elem: i32) -> TypeProto {
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: Some(elem),
            shape: None,
        })),
        ..Default::default()
    }
}

/// `ty` with the shapes of its tensors left unknown (branches of an If may
/// return different shapes).
fn without_shapes(ty: &TypeProto) -> Option<TypeProto> {
    match ty.value.as_ref()? {
        type_proto::Value::TensorType(t) => Some(tensor_type(t.elem_type?)),
        type_proto::Value::SequenceType(s) => Some(TypeProto {
            value: Some(type_proto::Value::SequenceType(Box::new(
                type_proto::Sequence {
                    elem_type: Some(Box::new(without_shapes(s.elem_type.as_deref()?)?)),
                },
            ))),
            ..Default::default()
        }),
        _ => None,
    }
}

/// The element type of a tensor or sequence-of-tensors type.
fn tensor_elem(ty: &TypeProto) -> Option<i32> {
    match ty.value.as_ref()? {
        type_proto::Value::TensorType(t) => t.elem_type,
        type_proto::Value::SequenceType(s) => tensor_elem(s.elem_type.as_deref()?),
        _ => None,
    }
}

/// A node making an empty value of type `ty` (a tensor of shape [0], or an
/// empty sequence) as `output`.
fn empty_of(ty: &TypeProto, output: &str) -> Option<NodeProto> {
    let elem = tensor_elem(ty)?;
    match ty.value.as_ref()? {
        type_proto::Value::TensorType(_) => {
            let value = TensorProto {
                dims: vec![0],
                data_type: Some(elem),
                ..Default::default()
            };
            let attribute = AttributeProto {
                name: Some("value".into()),
                r#type: Some(AttributeType::Tensor as i32),
                t: Some(value),
                ..Default::default()
            };
            Some(node("Constant", &[], &[output], vec![attribute]))
        }
        type_proto::Value::SequenceType(_) => Some(node(
            "SequenceEmpty",
            &[],
            &[output],
            vec![int_attribute("dtype", elem as i64)],
        )),
        _ => None,
    }
}

/// The type an optional value info holds, if it is an optional.
fn optional_contents(v: &ValueInfoProto) -> Option<&TypeProto> {
    match v.r#type.as_ref()?.value.as_ref()? {
        type_proto::Value::OptionalType(o) => o.elem_type.as_deref(),
        _ => None,
    }
}

fn branch(name: &str, node: NodeProto, output: &str, ty: TypeProto) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Graph as i32),
        g: Some(GraphProto {
            name: Some(name.into()),
            node: vec![node],
            output: vec![info(output, ty)],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `model` with every optional graph output returned as its contents plus
/// a flag (see the module doc; the flags after the graph's outputs), and
/// those outputs; `None` when no output is an optional (nothing copied).
pub(super) fn unwrap_optional_outputs(
    model: &ModelProto,
) -> Result<Option<(ModelProto, Vec<OptionalOutput>)>, String> {
    let any = model
        .graph
        .iter()
        .flat_map(|g| &g.output)
        .any(|o| optional_contents(o).is_some());
    if !any {
        return Ok(None);
    }
    let mut model = model.clone();
    let Some(graph) = model.graph.as_mut() else {
        return Ok(None);
    };
    let mut rewritten = Vec::new();
    for index in 0..graph.output.len() {
        let Some(contents) = optional_contents(&graph.output[index]).cloned() else {
            continue;
        };
        let name = graph.output[index].name.clone().unwrap_or_default();
        let ty = without_shapes(&contents).ok_or_else(|| {
            format!("optional output '{name}' holds neither a tensor nor a sequence of tensors")
        })?;
        let has = format!("{name}::tessera_has_element");
        let value = format!("{name}::tessera_contents");
        let (then_out, else_out) = (format!("{value}::then"), format!("{value}::else"));
        let get = node("OptionalGetElement", &[&name], &[&then_out], vec![]);
        let empty = empty_of(&ty, &else_out)
            .ok_or_else(|| format!("optional output '{name}': no empty value of its type"))?;
        graph
            .node
            .push(node("OptionalHasElement", &[&name], &[&has], vec![]));
        graph.node.push(node(
            "If",
            &[&has],
            &[&value],
            vec![
                branch("then_branch", get, &then_out, ty.clone()),
                branch("else_branch", empty, &else_out, ty.clone()),
            ],
        ));
        graph.output[index] = info(&value, ty);
        graph.output.push(info(&has, tensor_type(ElemType::BOOL.0)));
        rewritten.push(OptionalOutput { index, has });
    }
    Ok(Some((model, rewritten)))
}

/// The model with the inputs at `empty` (empty sequences, or optionals
/// holding one) made inside it by `SequenceEmpty` instead of fed.
pub(super) fn with_empty_sequences(
    model: &ModelProto,
    specs: &[TensorSpec],
    empty: &[usize],
) -> ModelProto {
    let mut model = model.clone();
    let Some(graph) = model.graph.as_mut() else {
        return model;
    };
    let mut made = Vec::new();
    for &k in empty {
        let spec = &specs[k];
        let dtype = vec![int_attribute("dtype", spec.elem.0 as i64)];
        if spec.kind == ValueKind::OptionalSequence {
            let inner = format!("{}::tessera_empty", spec.name);
            made.push(node("SequenceEmpty", &[], &[&inner], dtype));
            made.push(node("Optional", &[&inner], &[&spec.name], vec![]));
        } else {
            made.push(node("SequenceEmpty", &[], &[&spec.name], dtype));
        }
        graph
            .input
            .retain(|v| v.name.as_deref() != Some(spec.name.as_str()));
    }
    made.append(&mut graph.node);
    graph.node = made;
    model
}

/// The inputs (by position) that are empty sequences, fed by the model.
pub(super) fn empty_sequence_inputs(inputs: &[Value]) -> Vec<usize> {
    let empty = |v: &Value| matches!(v, Value::Sequence { items, .. } if items.is_empty());
    inputs
        .iter()
        .enumerate()
        .filter(|(_, v)| match v {
            Value::Optional(Some(inner)) => empty(inner),
            v => empty(v),
        })
        .map(|(k, _)| k)
        .collect()
}

/// A value as an onnxruntime input; `None` for an empty optional (left
/// out) and for an empty sequence (made inside the model).
pub(super) fn to_ort(v: &Value) -> Result<Option<SessionInputValue<'static>>, PluginError> {
    Ok(match v {
        Value::Tensor(t) => Some(convert::to_ort(t)?.into()),
        Value::Sequence { items, .. } if items.is_empty() => None,
        Value::Sequence { items, .. } => {
            let tensors = items
                .iter()
                .map(convert::to_ort)
                .collect::<Result<Vec<_>, _>>()?;
            let sequence = Sequence::new(tensors)
                .map_err(|e| PluginError::BadInput(format!("a sequence input: {e}")))?;
            Some(sequence.into_dyn().into())
        }
        Value::Optional(None) => None,
        Value::Optional(Some(inner)) => to_ort(inner)?,
    })
}

/// An onnxruntime output as a value of `spec`'s kind (an optional's flag
/// is applied by the caller).
pub(super) fn from_ort(spec: &TensorSpec, value: DynValue) -> Result<Value, PluginError> {
    if !matches!(value.dtype(), ValueType::Sequence(_)) {
        return Ok(Value::Tensor(convert::from_ort(&spec.name, value)?));
    }
    let sequence = value
        .downcast::<DynSequenceValueType>()
        .map_err(|e| PluginError::Infer(format!("output '{}': {e}", spec.name)))?;
    let items = sequence
        .try_extract_sequence::<DynTensorValueType>()
        .map_err(|e| PluginError::Infer(format!("output '{}': {e}", spec.name)))?
        .into_iter()
        .map(|t| convert::from_ort(&spec.name, t.into_dyn()))
        .collect::<Result<Vec<Tensor>, _>>()?;
    Ok(Value::Sequence {
        elem: spec.elem,
        items,
    })
}

/// Whether an optional output's flag says it holds something.
pub(super) fn holds_element(flag: &Tensor) -> bool {
    flag.bytes().first().is_some_and(|&b| b != 0)
}
