//! Structure of the expansions; their numerics are checked against the ONNX
//! node tests by the plugins' conformance suites.

use super::*;
use crate::onnx::proto::{
    attribute_proto::AttributeType, AttributeProto, GraphProto, ModelProto, OperatorSetIdProto,
};
use crate::onnx::tensor_info;
use crate::synth::node;

fn model(n: NodeProto, inputs: Vec<crate::onnx::proto::ValueInfoProto>, opset: i64) -> Graph {
    model_with(n, inputs, Vec::new(), opset)
}

fn model_with(
    n: NodeProto,
    inputs: Vec<crate::onnx::proto::ValueInfoProto>,
    initializer: Vec<TensorProto>,
    opset: i64,
) -> Graph {
    let outputs = n
        .output
        .iter()
        .map(|o| crate::onnx::proto::ValueInfoProto {
            name: Some(o.clone()),
            ..Default::default()
        })
        .collect();
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(GraphProto {
            node: vec![n],
            input: inputs,
            output: outputs,
            initializer,
            ..Default::default()
        }),
        ..Default::default()
    };
    Graph::from_model(m).expect("valid model")
}

fn int_attr(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        i: Some(v),
        r#type: Some(AttributeType::Int as i32),
        ..Default::default()
    }
}

fn ops(d: &Decomposed) -> Vec<String> {
    d.model
        .graph
        .as_ref()
        .map(|g| g.node.iter().filter_map(|n| n.op_type.clone()).collect())
        .unwrap_or_default()
}

#[test]
fn nll_with_weight_and_ignore_index_masks_and_normalizes() {
    let mut n = node(
        "loss",
        "NegativeLogLikelihoodLoss",
        &["x", "t", "w"],
        &["y"],
    );
    n.attribute.push(int_attr("ignore_index", -1));
    let g = model(
        n,
        vec![
            tensor_info("x", 1, &[3, 5]),
            tensor_info("t", 7, &[3]),
            tensor_info("w", 1, &[5]),
        ],
        13,
    );
    let d = decompose(&g, |_| true);
    assert_eq!(
        ops(&d),
        [
            "Equal",
            "Where",
            "Unsqueeze",
            "GatherElements",
            "Squeeze",
            "Gather",
            "Not",
            "Cast",
            "Mul",
            "Neg",
            "Mul",
            "ReduceSum",
            "ReduceSum",
            "Div"
        ]
    );
    let graph = d.model.graph.as_ref().expect("graph");
    assert_eq!(
        graph.node.last().map(|n| n.output.clone()),
        Some(vec!["y".into()])
    );
    assert!(graph
        .node
        .iter()
        .all(|n| d.origin[n.name.as_deref().unwrap_or("")] == "loss"));
    assert!(d.declined.is_empty());
}

#[test]
fn opset_12_takes_axes_as_attributes() {
    let n = node("loss", "NegativeLogLikelihoodLoss", &["x", "t"], &["y"]);
    let g = model(
        n,
        vec![tensor_info("x", 1, &[3, 5]), tensor_info("t", 7, &[3])],
        12,
    );
    let d = decompose(&g, |_| true);
    let graph = d.model.graph.as_ref().expect("graph");
    let unsqueeze = graph
        .node
        .iter()
        .find(|n| n.op_type.as_deref() == Some("Unsqueeze"))
        .expect("an Unsqueeze");
    assert_eq!(unsqueeze.input.len(), 1);
    assert_eq!(unsqueeze.attribute[0].ints, [1]);
    assert_eq!(ops(&d).last().map(String::as_str), Some("ReduceMean"));
}

#[test]
fn softmax_cross_entropy_writes_log_prob_as_its_second_output() {
    let n = node("sce", "SoftmaxCrossEntropyLoss", &["s", "t"], &["y", "lp"]);
    let g = model(
        n,
        vec![
            tensor_info("s", 1, &[2, 4, 3]),
            tensor_info("t", 7, &[2, 3]),
        ],
        13,
    );
    let d = decompose(&g, |_| true);
    let graph = d.model.graph.as_ref().expect("graph");
    assert_eq!(graph.node[0].op_type.as_deref(), Some("LogSoftmax"));
    assert_eq!(graph.node[0].output, ["lp"]);
    let gather = graph
        .node
        .iter()
        .find(|n| n.op_type.as_deref() == Some("GatherElements"))
        .expect("a GatherElements");
    assert_eq!(gather.input[0], "lp");
}

#[test]
fn unwanted_ops_and_declined_nodes_stay_as_they_are() {
    let mut n = node("pool", "LpPool", &["x"], &["y"]);
    n.attribute.push(AttributeProto {
        name: Some("kernel_shape".into()),
        ints: vec![2, 2],
        r#type: Some(AttributeType::Ints as i32),
        ..Default::default()
    });
    let mut dilated = n.clone();
    dilated.attribute.push(AttributeProto {
        name: Some("dilations".into()),
        ints: vec![2, 2],
        r#type: Some(AttributeType::Ints as i32),
        ..Default::default()
    });
    let x = || vec![tensor_info("x", 1, &[1, 1, 5, 5])];
    assert_eq!(
        ops(&decompose(&model(n, x(), 18), |op| op != "LpPool")),
        ["LpPool"]
    );
    let d = decompose(&model(dilated.clone(), x(), 18), |_| true);
    assert_eq!(ops(&d), ["Abs", "Pow", "Conv", "Pow"]);
    // Without a static shape the dilated form cannot be written.
    let dynamic = vec![tensor_info("x", 1, &[1, 1, -1, 5])];
    let d = decompose(&model(dilated, dynamic, 18), |_| true);
    assert_eq!(ops(&d), ["LpPool"]);
    assert!(
        matches!(&d.declined["pool"], Declined::Unknown(why) if why.contains("not static")),
        "{:?}",
        d.declined
    );
}

#[test]
fn center_crop_pad_crops_and_pads_around_the_centre() {
    let n = node("ccp", "CenterCropPad", &["x", "shape"], &["y"]);
    let shape = crate::tensor::Tensor::from_values(vec![3], &[6i64, 10, 3]).expect("tensor");
    let g = model_with(
        n,
        vec![tensor_info("x", 1, &[10, 7, 3])],
        vec![shape.to_proto("shape")],
        18,
    );
    let d = decompose(&g, |_| true);
    assert_eq!(ops(&d), ["Slice", "Pad"]);
    let inits = &d.model.graph.as_ref().expect("graph").initializer;
    let values = |name: &str| {
        let t = inits
            .iter()
            .find(|t| t.name.as_deref() == Some(name))
            .expect("constant");
        crate::tensor::Tensor::from_proto(t)
            .and_then(|t| t.to_vec::<i64>())
            .expect("int64")
    };
    // Crop 10 → 6 from 2; pad 7 → 10 with 1 before and 2 after.
    assert_eq!(values("ccp.c0"), [2]);
    assert_eq!(values("ccp.c1"), [8]);
    assert_eq!(values("ccp.c3"), [0, 1, 0, 0, 2, 0]);
}

#[test]
fn affine_grid_base_coordinates() {
    assert_eq!(super::layout::coordinates(3, true), [-1.0, 0.0, 1.0]);
    let c = super::layout::coordinates(2, false);
    assert_eq!(c, [-0.5, 0.5]);
}

#[test]
fn batch_first_recurrence_becomes_sequence_first_between_transposes() {
    let mut lstm = node(
        "l",
        "LSTM",
        &["x", "w", "r", "", "", "h0", "c0"],
        &["y", "yh"],
    );
    lstm.attribute.push(int_attr("layout", 1));
    lstm.attribute.push(int_attr("hidden_size", 4));
    let g = model(
        lstm,
        vec![
            tensor_info("x", 1, &[2, 5, 3]),
            tensor_info("w", 1, &[1, 16, 3]),
            tensor_info("r", 1, &[1, 16, 4]),
            tensor_info("h0", 1, &[2, 1, 4]),
            tensor_info("c0", 1, &[2, 1, 4]),
        ],
        14,
    );
    let d = decompose(&g, |_| true);
    assert_eq!(
        ops(&d),
        [
            "Transpose",
            "Transpose",
            "Transpose",
            "LSTM",
            "Transpose",
            "Transpose"
        ]
    );
    let inner = &d.model.graph.as_ref().unwrap().node[3];
    assert!(inner
        .attribute
        .iter()
        .all(|a| a.name.as_deref() != Some("layout")));
    assert!(inner
        .attribute
        .iter()
        .any(|a| a.name.as_deref() == Some("hidden_size")));
    assert_eq!(d.origin["l.d3"], "l");
    // Layout 0 is left alone.
    let plain = model(
        node("p", "RNN", &["x", "w", "r"], &["y"]),
        vec![
            tensor_info("x", 1, &[5, 2, 3]),
            tensor_info("w", 1, &[1, 4, 3]),
            tensor_info("r", 1, &[1, 4, 4]),
        ],
        14,
    );
    assert!(decompose(&plain, |_| true).origin.is_empty());
}

#[test]
fn casts_to_4_bits_saturate_and_round_half_to_even() {
    let mut cast = node("c", "Cast", &["x"], &["y"]);
    cast.attribute
        .push(int_attr("to", i64::from(ElemType::INT4.0)));
    let g = model(cast.clone(), vec![tensor_info("x", 1, &[6])], 21);
    assert_eq!(ops(&decompose(&g, |_| true)), ["Clip", "Round", "Cast"]);
    let ints = model(cast, vec![tensor_info("x", 6, &[6])], 21);
    assert_eq!(
        ops(&decompose(&ints, |_| true)),
        ["Cast", "Cast", "Clip", "Cast"]
    );
    let mut to_float = node("f", "Cast", &["x"], &["y"]);
    to_float.attribute.push(int_attr("to", 1));
    let g = model(to_float, vec![tensor_info("x", 6, &[6])], 21);
    assert!(decompose(&g, |_| true).origin.is_empty());
}

#[test]
fn narrow_min_max_and_unsigned_exponents_are_widened() {
    let g = model(
        node("m", "Max", &["a", "b"], &["y"]),
        vec![tensor_info("a", 5, &[3]), tensor_info("b", 5, &[3])],
        13,
    );
    assert_eq!(
        ops(&decompose(&g, |_| true)),
        ["Cast", "Cast", "Max", "Cast"]
    );
    let wide = model(
        node("m", "Max", &["a", "b"], &["y"]),
        vec![tensor_info("a", 6, &[3]), tensor_info("b", 6, &[3])],
        13,
    );
    assert!(decompose(&wide, |_| true).origin.is_empty());
    let pow = model(
        node("p", "Pow", &["x", "e"], &["y"]),
        vec![tensor_info("x", 1, &[3]), tensor_info("e", 12, &[3])],
        15,
    );
    assert_eq!(ops(&decompose(&pow, |_| true)), ["Cast", "Pow"]);
    // Only the nodes picked are rewritten.
    assert!(
        decompose_where(&pow, |n| n.name.as_deref() == Some("other"))
            .origin
            .is_empty()
    );
}

fn training_node(op: &str, inputs: &[&str], outputs: &[&str], mode: Option<&str>) -> NodeProto {
    let mut n = node("opt", op, inputs, outputs);
    n.domain = Some("ai.onnx.preview.training".into());
    for (name, v) in [("alpha", 0.9f32), ("beta", 0.5), ("norm_coefficient", 0.0)] {
        n.attribute.push(AttributeProto {
            name: Some(name.into()),
            f: Some(v),
            r#type: Some(AttributeType::Float as i32),
            ..Default::default()
        });
    }
    if let Some(mode) = mode {
        n.attribute.push(AttributeProto {
            name: Some("mode".into()),
            s: Some(mode.as_bytes().to_vec()),
            r#type: Some(AttributeType::String as i32),
            ..Default::default()
        });
    }
    n
}

fn training_inputs(names: &[&str]) -> Vec<crate::onnx::proto::ValueInfoProto> {
    let mut inputs = vec![tensor_info("R", 1, &[]), tensor_info("T", 7, &[])];
    inputs.extend(names.iter().map(|n| tensor_info(n, 1, &[2])));
    inputs
}

#[test]
fn training_optimizers_write_every_output_and_decline_what_they_cannot() {
    // Adam over two tensors: each new X, V and H is written under its name.
    let n = training_node(
        "Adam",
        &["R", "T", "X1", "X2", "G1", "G2", "V1", "V2", "H1", "H2"],
        &["X1n", "X2n", "V1n", "V2n", "H1n", "H2n"],
        None,
    );
    let g = model(
        n,
        training_inputs(&["X1", "X2", "G1", "G2", "V1", "V2", "H1", "H2"]),
        17,
    );
    let d = decompose(&g, |op| op == "Adam");
    let written: Vec<String> = d
        .model
        .graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .flat_map(|n| n.output.clone())
        .collect();
    for name in ["X1n", "X2n", "V1n", "V2n", "H1n", "H2n"] {
        assert!(written.contains(&name.to_string()), "{name} not written");
    }
    assert!(!ops(&d).contains(&"Adam".to_string()));

    // Momentum with an unknown mode, and inputs that make no groups of 3,
    // are left as they are, with the reason.
    let n = training_node(
        "Momentum",
        &["R", "T", "X1", "G1", "V1"],
        &["X1n", "V1n"],
        Some("heavy"),
    );
    let g = model(n, training_inputs(&["X1", "G1", "V1"]), 17);
    let d = decompose(&g, |op| op == "Momentum");
    assert!(
        matches!(&d.declined["opt"], Declined::Unsupported(why) if why.contains("mode 'heavy'")),
        "{:?}",
        d.declined
    );
    let n = training_node("Adagrad", &["R", "T", "X1", "G1"], &["X1n"], None);
    let g = model(n, training_inputs(&["X1", "G1"]), 17);
    let d = decompose(&g, |op| op == "Adagrad");
    assert!(
        d.declined["opt"].to_string().contains("groups of 3"),
        "{:?}",
        d.declined
    );
}
