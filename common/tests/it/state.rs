//! State pairs: found by the Optimum / onnxruntime-genai names or declared
//! in metadata, checked, kept on one device, and their memory counted.

use tessera_common::graph::{Graph, StateError, StatePair, PADDING_KEY, STATE_PAIRS_KEY};
use tessera_common::onnx::proto::{GraphProto, StringStringEntryProto};
use tessera_common::onnx::{tensor_info, ElemType};
use tessera_common::synth::{node, opset17};

const F32: i32 = ElemType::FLOAT.0;

/// x[1,4] → Add(x, x) = h; Concat(past, h) along 0 = present; y = Relu(h).
/// The past is `past_key_values.0.key` (rank 2), the present
/// `present.0.key`.
fn decoder_like(past: &str, present: &str, past_rank: usize) -> GraphProto {
    let past_dims: Vec<i64> = [0, 4].iter().take(past_rank).copied().collect();
    GraphProto {
        name: Some("decoder".into()),
        node: vec![
            node("add", "Add", &["x", "x"], &["h"]),
            node("concat", "Concat", &[past, "h"], &[present]),
            node("relu", "Relu", &["h"], &["y"]),
        ],
        input: vec![
            tensor_info("x", F32, &[1, 4]),
            tensor_info(past, F32, &past_dims),
        ],
        output: vec![
            tensor_info("y", F32, &[1, 4]),
            tensor_info(present, F32, &[1, 4]),
        ],
        ..Default::default()
    }
}

fn with_axis(mut g: GraphProto) -> GraphProto {
    g.node[1]
        .attribute
        .push(tessera_common::onnx::proto::AttributeProto {
            name: Some("axis".into()),
            r#type: Some(tessera_common::onnx::proto::attribute_proto::AttributeType::Int as i32),
            i: Some(0),
            ..Default::default()
        });
    g
}

#[test]
fn pairs_are_found_by_the_genai_names() {
    let g = with_axis(decoder_like("past_key_values.0.key", "present.0.key", 2));
    let graph = Graph::from_model(opset17(g)).expect("graph");
    let pairs = graph.state_pairs().expect("pairs");
    assert_eq!(
        pairs,
        vec![StatePair {
            present: "present.0.key".into(),
            past: "past_key_values.0.key".into(),
            axis: None,
            pads_right: false,
        }]
    );
    // 4 floats per position; 10 positions → 160 bytes, on the Concat.
    assert_eq!(graph.state_bytes_per_position(&pairs[0]), Some(16));
    let need = graph.state_need(&pairs, 10);
    assert_eq!(need.get("concat"), Some(&160));
}

#[test]
fn pairs_come_from_metadata_and_are_checked() {
    let g = with_axis(decoder_like("cache_in", "cache_out", 2));
    let mut model = opset17(g);
    let graph = Graph::from_model(model.clone()).expect("graph");
    assert!(graph.state_pairs().expect("none").is_empty());
    model.metadata_props.push(StringStringEntryProto {
        key: Some(STATE_PAIRS_KEY.into()),
        value: Some(r#"[["cache_out", "cache_in"]]"#.into()),
    });
    let graph = Graph::from_model(model.clone()).expect("graph");
    assert_eq!(graph.state_pairs().expect("declared").len(), 1);
    model.metadata_props[0].value = Some(r#"[["y", "x"]]"#.into());
    let graph = Graph::from_model(model.clone()).expect("graph");
    assert!(
        graph.state_pairs().is_ok(),
        "y and x agree in type and rank"
    );
    model.metadata_props[0].value = Some(r#"[["nope", "x"]]"#.into());
    let graph = Graph::from_model(model.clone()).expect("graph");
    let err = graph.state_pairs().unwrap_err();
    assert!(matches!(err, StateError::Mismatch { .. }), "{err}");
    assert!(err.to_string().contains("not a graph output"), "{err}");
    model.metadata_props[0].value = Some("[1, 2".into());
    let graph = Graph::from_model(model).expect("graph");
    let err = graph.state_pairs().unwrap_err();
    assert!(err.to_string().contains("not a JSON list"), "{err}");
}

#[test]
fn the_model_says_on_which_side_a_batch_pads_its_state() {
    let g = with_axis(decoder_like("past_key_values.0.key", "present.0.key", 2));
    let mut model = opset17(g);
    let pads_right = |model: &tessera_common::onnx::proto::ModelProto| {
        let graph = Graph::from_model(model.clone()).expect("graph");
        graph.state_pairs().map(|p| p[0].pads_right)
    };
    assert_eq!(pads_right(&model), Ok(false), "left unless it says");
    model.metadata_props.push(StringStringEntryProto {
        key: Some(PADDING_KEY.into()),
        value: Some("right".into()),
    });
    assert_eq!(pads_right(&model), Ok(true));
    model.metadata_props[0].value = Some("left".into());
    assert_eq!(pads_right(&model), Ok(false));
    model.metadata_props[0].value = Some("middle".into());
    let err = pads_right(&model).unwrap_err();
    assert_eq!(err, StateError::BadPadding("middle".into()));
    assert!(
        err.to_string()
            .contains("\"middle\", not \"left\" or \"right\""),
        "{err}"
    );
}

#[test]
fn a_pair_of_different_ranks_is_refused() {
    let g = with_axis(decoder_like("past_key_values.0.key", "present.0.key", 1));
    let graph = Graph::from_model(opset17(g)).expect("graph");
    // Paired by name; the check finds that the ranks differ.
    let err = graph.state_pairs().unwrap_err();
    assert!(err.to_string().contains("ranks differ"), "{err}");
}

/// `past`'s dimensions made symbolic where `symbolic` says so.
fn symbolic_dims(g: &mut GraphProto, past: &str, symbolic: &[bool]) {
    use tessera_common::onnx::proto::tensor_shape_proto::dimension::Value;
    use tessera_common::onnx::proto::type_proto;
    let info = g
        .input
        .iter_mut()
        .find(|i| i.name.as_deref() == Some(past))
        .expect("the past input");
    let Some(type_proto::Value::TensorType(t)) =
        info.r#type.as_mut().and_then(|t| t.value.as_mut())
    else {
        panic!("a tensor input");
    };
    let dims = &mut t.shape.as_mut().expect("a shape").dim;
    for (i, (d, &sym)) in dims.iter_mut().zip(symbolic).enumerate() {
        if sym {
            d.value = Some(Value::DimParam(format!("d{i}")));
        }
    }
}

#[test]
fn the_positions_axis_is_the_only_symbolic_one_besides_the_batch() {
    let axis_of = |symbolic: &[bool]| {
        let mut g = with_axis(decoder_like("past_key_values.0.key", "present.0.key", 2));
        symbolic_dims(&mut g, "past_key_values.0.key", symbolic);
        let graph = Graph::from_model(opset17(g)).expect("graph");
        graph.state_pairs().expect("pairs")[0].axis
    };
    // [batch, positions]: the positions grow along axis 1.
    assert_eq!(axis_of(&[true, true]), Some(1));
    assert_eq!(axis_of(&[false, true]), Some(1));
    // Nothing grows besides the batch: no axis to pad along.
    assert_eq!(axis_of(&[true, false]), None);
    assert_eq!(axis_of(&[false, false]), None);
}
