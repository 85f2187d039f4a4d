//! Sequences and optionals through the onnxruntime plugin's
//! `infer_values`: a graph that takes a sequence and an optional and
//! returns a sequence and an optional, run with full and empty values
//! (an empty sequence is made inside a variant of the model, an empty
//! optional left out, an empty optional output comes back as `None`), and
//! the clear errors of the tensor path and of a value of the wrong kind.

use crate::util;

use tessera_common::onnx::encode_model;
use tessera_common::onnx::proto::GraphProto;
use tessera_common::onnx::ElemType;
use tessera_common::synth::{node, opset17, tensor_info};
use tessera_common::tensor::{Tensor, Value};
use tessera_worker::plugin::{Config, ValueKind};

fn sequence_of_floats(name: &str) -> tessera_common::onnx::proto::ValueInfoProto {
    tessera_common::onnx::sequence_info(name, ElemType::FLOAT.0)
}

fn optional_float(name: &str) -> tessera_common::onnx::proto::ValueInfoProto {
    tessera_common::onnx::optional_info(name, ElemType::FLOAT.0)
}

/// `x → SplitToSequence → parts`, `s → SequenceLength → n`,
/// `o → OptionalHasElement → has`, `o → Identity → o_out`.
fn sequence_model() -> Vec<u8> {
    let mut g = GraphProto {
        name: Some("values".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", ElemType::FLOAT.0, &[3]));
    g.input.push(sequence_of_floats("s"));
    g.input.push(optional_float("o"));
    g.node
        .push(node("split", "SplitToSequence", &["x"], &["parts"]));
    g.node
        .push(node("length", "SequenceLength", &["s"], &["n"]));
    g.node
        .push(node("has", "OptionalHasElement", &["o"], &["has"]));
    g.node
        .push(node("identity", "Identity", &["o"], &["o_out"]));
    g.output.push(sequence_of_floats("parts"));
    g.output.push(tensor_info("n", ElemType::INT64.0, &[]));
    g.output.push(tensor_info("has", ElemType::BOOL.0, &[]));
    g.output.push(optional_float("o_out"));
    encode_model(&opset17(g))
}

fn floats(values: &[f32]) -> Tensor {
    Tensor::from_values(vec![values.len()], values).unwrap()
}

#[test]
fn sequences_and_optionals_in_and_out() {
    let cpu = util::cpu_plugin("onnxruntime", "CPU");
    let compiled = cpu
        .compile(&sequence_model().into(), &Config::default())
        .unwrap();
    let kinds: Vec<ValueKind> = compiled.inputs().iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            ValueKind::Tensor,
            ValueKind::Sequence,
            ValueKind::OptionalTensor
        ]
    );
    let kinds: Vec<ValueKind> = compiled.outputs().iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            ValueKind::Sequence,
            ValueKind::Tensor,
            ValueKind::Tensor,
            ValueKind::OptionalTensor
        ]
    );
    let names: Vec<&str> = compiled.outputs().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["parts", "n", "has", "o_out"]);

    let x = floats(&[1.0, 2.0, 3.0]);
    let held = floats(&[7.0, 8.0]);
    let full = compiled
        .infer_values(&[
            Value::Tensor(x.clone()),
            Value::sequence(ElemType::FLOAT, vec![floats(&[1.0]), floats(&[2.0, 3.0])]),
            Value::Optional(Some(Box::new(Value::Tensor(held.clone())))),
        ])
        .unwrap();
    // SplitToSequence without `split` cuts along axis 0 into pieces of 1,
    // dropping that axis (keepdims=1 keeps it as 1).
    let pieces: Vec<Tensor> = [1.0f32, 2.0, 3.0]
        .iter()
        .map(|&v| Tensor::from_values(vec![1], &[v]).unwrap())
        .collect();
    assert_eq!(full[0], Value::sequence(ElemType::FLOAT, pieces.clone()));
    assert_eq!(
        full[1],
        Value::Tensor(Tensor::from_values(vec![], &[2i64]).unwrap())
    );
    assert_eq!(
        full[2],
        Value::Tensor(Tensor::from_values(vec![], &[true]).unwrap())
    );
    assert_eq!(
        full[3],
        Value::Optional(Some(Box::new(Value::Tensor(held))))
    );

    // An empty sequence and an empty optional, twice (the variant's
    // session is kept and reused).
    for _ in 0..2 {
        let empty = compiled
            .infer_values(&[
                Value::Tensor(x.clone()),
                Value::sequence(ElemType::FLOAT, vec![]),
                Value::Optional(None),
            ])
            .unwrap();
        assert_eq!(empty[0], Value::sequence(ElemType::FLOAT, pieces.clone()));
        assert_eq!(
            empty[1],
            Value::Tensor(Tensor::from_values(vec![], &[0i64]).unwrap())
        );
        assert_eq!(
            empty[2],
            Value::Tensor(Tensor::from_values(vec![], &[false]).unwrap())
        );
        assert_eq!(empty[3], Value::Optional(None));
    }
}

#[test]
fn values_of_the_wrong_kind_are_clear_errors() {
    let cpu = util::cpu_plugin("onnxruntime", "CPU");
    let compiled = cpu
        .compile(&sequence_model().into(), &Config::default())
        .unwrap();
    let x = floats(&[1.0, 2.0, 3.0]);
    // The tensor path cannot carry a sequence input.
    let err = compiled
        .infer(&[x.clone(), x.clone(), x.clone()])
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("'s' is a sequence of tensors") && err.contains("infer_values"),
        "{err}"
    );
    // A tensor where a sequence is declared.
    let err = compiled
        .infer_values(&[
            Value::Tensor(x.clone()),
            Value::Tensor(x.clone()),
            Value::Optional(None),
        ])
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("'s' must be a sequence of tensors"), "{err}");
    // A sequence whose tensors are of another element type.
    let ints = Tensor::from_values(vec![1], &[1i64]).unwrap();
    let err = compiled
        .infer_values(&[
            Value::Tensor(x),
            Value::sequence(ElemType::INT64, vec![ints]),
            Value::Optional(None),
        ])
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("must be float"), "{err}");
}
