//! The simplifier: constant and shape folding, concrete input shapes, dead
//! nodes, the size cap; and the type table's coverage of the default domain.

use std::collections::BTreeMap;

use tessera_common::graph::{Dim, Graph};
use tessera_common::onnx::proto::{AttributeProto, GraphProto, ModelProto, NodeProto};
use tessera_common::simplify::{simplify, SimplifyError, SimplifyOptions};
use tessera_common::synth::{node, opset17, tensor_info};
use tessera_common::tensor::Tensor;

fn ints(name: &str, values: &[i64]) -> tessera_common::onnx::proto::TensorProto {
    Tensor::from_values(vec![values.len()], values)
        .unwrap()
        .to_proto(name)
}

fn with_attr_i(mut n: NodeProto, name: &str, v: i64) -> NodeProto {
    n.attribute.push(AttributeProto {
        name: Some(name.into()),
        i: Some(v),
        r#type: Some(2),
        ..Default::default()
    });
    n
}

/// x[?,3,?,?] → Shape → Gather(0) / Gather(1) → Unsqueeze → Concat with
/// [-1] → Reshape(x): the YOLO-style flatten of a detector head.
fn shape_chain() -> ModelProto {
    let mut g = GraphProto {
        name: Some("chain".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[-1, 3, -1, -1]));
    g.initializer.push(ints("i0", &[0]));
    g.initializer.push(ints("i1", &[1]));
    g.initializer.push(ints("minus1", &[-1]));
    g.node.push(node("shape", "Shape", &["x"], &["s"]));
    g.node.push(with_attr_i(
        node("g0", "Gather", &["s", "i0"], &["d0"]),
        "axis",
        0,
    ));
    g.node.push(with_attr_i(
        node("g1", "Gather", &["s", "i1"], &["d1"]),
        "axis",
        0,
    ));
    g.node.push(with_attr_i(
        node("cat", "Concat", &["d0", "d1", "minus1"], &["target"]),
        "axis",
        0,
    ));
    g.node
        .push(node("reshape", "Reshape", &["x", "target"], &["y"]));
    g.node.push(node("relu", "Relu", &["y"], &["z"]));
    g.node.push(node("unused", "Neg", &["x"], &["dead"]));
    g.output.push(tensor_info("z", 1, &[-1, -1, -1]));
    opset17(g)
}

fn op_names(m: &ModelProto) -> Vec<String> {
    m.graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .map(|n| n.name.clone().unwrap_or_default())
        .collect()
}

#[test]
fn shape_chain_folds_to_a_constant_target_with_concrete_shapes() {
    let options = SimplifyOptions {
        input_shapes: BTreeMap::from([("x".to_string(), vec![2, 3, 8, 8])]),
        ..Default::default()
    };
    let (model, report) = simplify(&shape_chain(), &options).unwrap();
    assert_eq!(op_names(&model), ["reshape", "relu"]);
    let folded: Vec<&str> = report.folded.iter().map(|f| f.node.as_str()).collect();
    assert_eq!(folded, ["shape", "g0", "g1", "cat"]);
    assert_eq!(report.dead.len(), 1, "{report:?}");
    assert!(
        report.summary().contains("folded 4 nodes"),
        "{}",
        report.summary()
    );
    let g = model.graph.as_ref().unwrap();
    let target = g
        .initializer
        .iter()
        .find(|t| t.name.as_deref() == Some("target"))
        .expect("the Reshape's target is an initializer");
    assert_eq!(
        Tensor::from_proto(target).unwrap().int_values().unwrap(),
        vec![2, 3, -1]
    );
    // Unused initializers are gone; the Reshape's output is now typed.
    assert!(g
        .initializer
        .iter()
        .all(|t| t.name.as_deref() == Some("target")));
    let graph = Graph::from_model(model).unwrap();
    let y = graph.tensor(graph.tensor_by_name("y").unwrap());
    assert_eq!(
        y.shape,
        Some(vec![Dim::Known(2), Dim::Known(3), Dim::Known(64)])
    );
}

#[test]
fn dynamic_dims_stay_dynamic_but_known_dims_fold() {
    let (model, report) = simplify(&shape_chain(), &SimplifyOptions::default()).unwrap();
    // The batch dim is dynamic: the Shape, the batch Gather and the
    // Concat stay; the channel Gather selects a static dim and folds.
    assert_eq!(op_names(&model), ["shape", "g0", "cat", "reshape", "relu"]);
    assert_eq!(report.folded.len(), 1);
    assert_eq!(report.folded[0].node, "g1");
    let g = model.graph.as_ref().unwrap();
    let d1 = g
        .initializer
        .iter()
        .find(|t| t.name.as_deref() == Some("d1"))
        .unwrap();
    assert_eq!(
        Tensor::from_proto(d1).unwrap().int_values().unwrap(),
        vec![3]
    );
    // The graph input keeps its dynamic dims.
    let graph = Graph::from_model(model).unwrap();
    let x = graph.tensor(graph.inputs[0]);
    assert_eq!(x.shape.as_ref().unwrap()[0], Dim::Unknown);
}

#[test]
fn bad_shapes_are_named() {
    let shapes = |name: &str, dims: Vec<usize>| SimplifyOptions {
        input_shapes: BTreeMap::from([(name.to_string(), dims)]),
        ..Default::default()
    };
    let err = simplify(&shape_chain(), &shapes("nope", vec![1])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--shape names 'nope', which is not a graph input; the inputs are: x"
    );
    let err = simplify(&shape_chain(), &shapes("x", vec![1, 4, 8, 8])).unwrap_err();
    assert!(matches!(err, SimplifyError::ShapeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("[?,3,?,?]"), "{err}");
    let err = simplify(&shape_chain(), &shapes("x", vec![1, 3])).unwrap_err();
    assert!(matches!(err, SimplifyError::ShapeMismatch { .. }), "{err}");
}

#[test]
fn constants_fold_under_the_size_cap() {
    let mut g = GraphProto {
        name: Some("consts".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[4]));
    g.initializer.push(ints("a", &[1, 2, 3, 4]));
    g.initializer.push(ints("big_shape", &[1024, 1024]));
    g.node
        .push(with_attr_i(node("cast", "Cast", &["a"], &["af"]), "to", 1));
    g.node.push(node("mul", "Mul", &["af", "af"], &["sq"]));
    g.node.push(node("add", "Add", &["x", "sq"], &["y"]));
    // A 4 MiB tensor made from a shape: folding would grow the model.
    g.node
        .push(node("fill", "ConstantOfShape", &["big_shape"], &["w"]));
    g.node.push(node("rsum", "ReduceSum", &["w"], &["total"]));
    g.output.push(tensor_info("y", 1, &[4]));
    g.output.push(tensor_info("total", 1, &[1, 1]));
    let (model, report) = simplify(&opset17(g), &SimplifyOptions::default()).unwrap();
    assert_eq!(op_names(&model), ["add", "fill", "rsum"]);
    let folded: Vec<&str> = report.folded.iter().map(|f| f.node.as_str()).collect();
    assert_eq!(folded, ["cast", "mul"]);
    let g = model.graph.as_ref().unwrap();
    let sq = g
        .initializer
        .iter()
        .find(|t| t.name.as_deref() == Some("sq"))
        .unwrap();
    assert_eq!(
        Tensor::from_proto(sq).unwrap().float_values().unwrap(),
        vec![1.0, 4.0, 9.0, 16.0]
    );
}

#[test]
fn a_weight_stored_as_float16_folds_to_float32_whatever_its_size() {
    // 64Ki scales stored as float16 (128 KiB) and cast to float32 (256 KiB,
    // over the 64 KiB cap): folded, since the cast copy replaces the stored
    // one; a copy of a weight that something else also reads stays an op.
    let halves: Vec<half::f16> = (0..65536)
        .map(|i| half::f16::from_f32(i as f32 / 64.0))
        .collect();
    let scales = Tensor::from_values(vec![256, 256], &halves).unwrap();
    let mut g = GraphProto {
        name: Some("halves".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[256, 256]));
    g.initializer.push(scales.to_proto("scales_f16"));
    g.initializer.push(scales.to_proto("shared_f16"));
    g.node.push(with_attr_i(
        node("cast", "Cast", &["scales_f16"], &["scales"]),
        "to",
        1,
    ));
    g.node.push(with_attr_i(
        node("cast_shared", "Cast", &["shared_f16"], &["shared"]),
        "to",
        1,
    ));
    g.node.push(node("mul", "Mul", &["x", "scales"], &["y"]));
    g.node.push(node("add", "Add", &["y", "shared"], &["z"]));
    g.node
        .push(node("keep", "Identity", &["shared_f16"], &["copy"]));
    g.output.push(tensor_info("z", 1, &[256, 256]));
    g.output.push(tensor_info("copy", 10, &[256, 256]));
    let (model, report) = simplify(&opset17(g), &SimplifyOptions::default()).unwrap();
    let folded: Vec<&str> = report.folded.iter().map(|f| f.node.as_str()).collect();
    assert_eq!(folded, ["cast"]);
    assert_eq!(op_names(&model), ["cast_shared", "mul", "add", "keep"]);
    let g = model.graph.as_ref().unwrap();
    let cast = g
        .initializer
        .iter()
        .find(|t| t.name.as_deref() == Some("scales"))
        .unwrap();
    let values = Tensor::from_proto(cast).unwrap().float_values().unwrap();
    assert_eq!(values.len(), 65536);
    assert_eq!(values[65535], halves[65535].to_f32());
    assert_eq!(values[3], 3.0 / 64.0);
}

#[test]
fn every_default_domain_op_up_to_opset_21_has_a_type_rule() {
    // The default-domain ops of onnx 1.17's schemas up to opset 21.
    const OPS: &str = "Abs Acos Acosh Add AffineGrid And ArgMax ArgMin Asin Asinh Atan Atanh \
        AveragePool BatchNormalization Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr \
        BitwiseXor BlackmanWindow Cast CastLike Ceil Celu CenterCropPad Clip Col2Im Compress \
        Concat ConcatFromSequence Constant ConstantOfShape Conv ConvInteger ConvTranspose Cos \
        Cosh CumSum DFT DeformConv DepthToSpace DequantizeLinear Det Div Dropout \
        DynamicQuantizeLinear Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor GRU Gather \
        GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater \
        GreaterOrEqual GridSample GroupNormalization HammingWindow HannWindow HardSigmoid \
        HardSwish Hardmax Identity If ImageDecoder InstanceNormalization IsInf IsNaN LRN LSTM \
        LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop LpNormalization \
        LpPool MatMul MatMulInteger Max MaxPool MaxRoiPool MaxUnpool Mean \
        MeanVarianceNormalization MelWeightMatrix Min Mish Mod Mul Multinomial Neg \
        NegativeLogLikelihoodLoss NonMaxSuppression NonZero Not OneHot Optional \
        OptionalGetElement OptionalHasElement Or PRelu Pad Pow QLinearConv QLinearMatMul \
        QuantizeLinear RNN RandomNormal RandomNormalLike RandomUniform RandomUniformLike Range \
        Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean \
        ReduceMin ReduceProd ReduceSum ReduceSumSquare RegexFullMatch Relu Reshape Resize \
        ReverseSequence RoiAlign Round STFT Scan Scatter ScatterElements ScatterND Selu \
        SequenceAt SequenceConstruct SequenceEmpty SequenceErase SequenceInsert SequenceLength \
        SequenceMap Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax \
        SoftmaxCrossEntropyLoss Softplus Softsign SpaceToDepth Split SplitToSequence Sqrt \
        Squeeze StringConcat StringNormalizer StringSplit Sub Sum Tan Tanh TfIdfVectorizer \
        ThresholdedRelu Tile TopK Transpose Trilu Unique Unsqueeze Upsample Where Xor";
    let missing: Vec<&str> = OPS
        .split_whitespace()
        .filter(|op| !tessera_common::ops::entry(op).is_some_and(|e| e.infers_types()))
        .collect();
    assert!(missing.is_empty(), "no type rule for {missing:?}");
}

#[test]
fn recurrent_and_multi_output_ops_get_ranks() {
    let mut g = GraphProto {
        name: Some("lstm".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[-1, 1, 64]));
    g.input.push(tensor_info("w", 1, &[2, 512, 64]));
    g.input.push(tensor_info("r", 1, &[2, 512, 128]));
    let mut lstm = node("lstm", "LSTM", &["x", "w", "r"], &["y", "y_h", "y_c"]);
    lstm = with_attr_i(lstm, "hidden_size", 128);
    lstm.attribute.push(AttributeProto {
        name: Some("direction".into()),
        s: Some(b"bidirectional".to_vec()),
        r#type: Some(3),
        ..Default::default()
    });
    g.node.push(lstm);
    g.node.push(with_attr_i(
        node("topk", "TopK", &["y_h", "k"], &["v", "i"]),
        "axis",
        -1,
    ));
    g.initializer.push(ints("k", &[5]));
    g.output.push(tensor_info("y", 1, &[-1, 2, 1, 128]));
    g.output.push(tensor_info("y_c", 1, &[2, 1, 128]));
    g.output.push(tensor_info("v", 1, &[2, 1, 5]));
    g.output.push(tensor_info("i", 7, &[2, 1, 5]));
    // Drop the declared output types: inference must find them.
    for o in g.output.iter_mut() {
        o.r#type = None;
    }
    let graph = Graph::from_model(opset17(g)).unwrap();
    let t = |name: &str| graph.tensor(graph.tensor_by_name(name).unwrap()).clone();
    assert_eq!(t("y").type_string(), "float[?,2,1,128]");
    assert_eq!(t("y_h").type_string(), "float[2,1,128]");
    assert_eq!(t("v").type_string(), "float[2,1,5]");
    assert_eq!(t("i").type_string(), "int64[2,1,5]");
}

#[test]
fn shape_with_start_and_end_has_as_many_dims_as_it_selects() {
    // x[?,?,4] → Shape(start=1) [2], Shape(start=0, end=1) [1],
    // Shape(start=-1) [1]; Expand(v, the last) → [?] (rank 1).
    let mut g = GraphProto {
        name: Some("shapes".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[-1, -1, 4]));
    g.input.push(tensor_info("v", 6, &[1]));
    g.node.push(with_attr_i(
        node("tail", "Shape", &["x"], &["tail"]),
        "start",
        1,
    ));
    let head = with_attr_i(node("head", "Shape", &["x"], &["head"]), "start", 0);
    g.node.push(with_attr_i(head, "end", 1));
    g.node.push(with_attr_i(
        node("last", "Shape", &["x"], &["last"]),
        "start",
        -1,
    ));
    g.node
        .push(node("expand", "Expand", &["v", "head"], &["rows"]));
    for name in ["tail", "head", "last", "rows"] {
        g.output.push(tensor_info(name, 7, &[]));
    }
    for o in g.output.iter_mut() {
        o.r#type = None;
    }
    let graph = Graph::from_model(opset17(g)).unwrap();
    let t = |name: &str| graph.tensor(graph.tensor_by_name(name).unwrap()).clone();
    assert_eq!(t("tail").type_string(), "int64[2]");
    assert_eq!(t("head").type_string(), "int64[1]");
    assert_eq!(t("last").type_string(), "int64[1]");
    assert_eq!(t("rows").type_string(), "int32[?]");
}

#[test]
fn types_reported_by_backends_complete_the_graph() {
    let mut g = GraphProto {
        name: Some("custom".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[4]));
    let mut custom = node("mine", "MyOp", &["x"], &["y"]);
    custom.domain = Some("my.domain".into());
    g.node.push(custom);
    g.node.push(node("relu", "Relu", &["y"], &["z"]));
    g.output.push(tensor_info("z", 1, &[4]));
    let graph = Graph::from_model(opset17(g)).unwrap();
    let y = graph.tensor_by_name("y").unwrap();
    assert_eq!(graph.tensor(y).elem_type, None, "no rule for a custom op");
    assert_eq!(graph.tensor(y).shape, None, "its rank is not guessed");
    let reported = BTreeMap::from([(
        "y".to_string(),
        tessera_common::plan::ReportedType {
            elem: Some(tessera_common::onnx::ElemType::FLOAT),
            shape: Some(vec![Dim::Known(4)]),
        },
    )]);
    let graph = tessera_common::plan::complete_types(graph, &reported).unwrap();
    let y = graph.tensor(graph.tensor_by_name("y").unwrap());
    assert_eq!(y.type_string(), "float[4]");
    assert!(graph.op_by_name("mine").is_some(), "node names are kept");
}

/// A `Constant` node `name` making `output`, the float 2.0 of shape [1].
fn constant_two(name: &str, output: &str) -> NodeProto {
    let mut constant = node(name, "Constant", &[], &[output]);
    constant.attribute.push(AttributeProto {
        name: Some("value".into()),
        t: Some(
            Tensor::from_values(vec![1], &[2.0f32])
                .unwrap()
                .to_proto(""),
        ),
        r#type: Some(4),
        ..Default::default()
    });
    constant
}

/// A Constant that only fed what simplification removed goes with it, yet
/// a manual affinity naming it (a pin copied from the model file) is
/// still accepted: it has nothing to place.
#[test]
fn a_pin_on_a_constant_removed_with_what_it_fed_is_accepted() {
    use tessera_common::affinity::{parse_manual_affinity, DevicePriority, UnplacedWhy};
    let mut model = shape_chain();
    let g = model.graph.as_mut().unwrap();
    g.node.push(constant_two("orphan_k", "orphan"));
    let shapes = BTreeMap::from([("x".to_string(), vec![1, 3, 4, 4])]);
    let (graph, report) = tessera_common::plan::prepare(&model, &shapes).unwrap();
    assert_eq!(report.dropped_constants, ["orphan_k"]);
    assert!(
        !report.summary().contains("Constant"),
        "{}",
        report.summary()
    );
    let priority = DevicePriority::parse("HETERO:CPU").unwrap();
    let manual =
        parse_manual_affinity(r#"{"orphan_k": "CPU"}"#, &graph, &report, &priority).unwrap();
    assert_eq!(manual.unplaced[0].why, UnplacedWhy::Constant);
}

/// A manual affinity names nodes as the model file has them (e.g. read in
/// Netron): a Constant, or a node that simplification folded or removed,
/// is accepted and reported with why it has nothing to place; a name in
/// the model nowhere stays an error.
#[test]
fn manual_affinity_accepts_constants_and_folded_nodes() {
    use tessera_common::affinity::{parse_manual_affinity, DevicePriority, UnplacedWhy};
    let mut model = shape_chain();
    let g = model.graph.as_mut().unwrap();
    g.node.push(constant_two("k", "kv"));
    g.node.push(node("add_k", "Add", &["z", "kv"], &["out"]));
    g.output[0] = tensor_info("out", 1, &[-1, -1, -1]);
    let shapes = BTreeMap::from([("x".to_string(), vec![1, 3, 4, 4])]);
    let (graph, report) = tessera_common::plan::prepare(&model, &shapes).unwrap();
    let priority = DevicePriority::parse("HETERO:CPU").unwrap();

    let text = r#"{"relu": "CPU", "shape": "CPU", "unused": "CPU", "k": "CPU"}"#;
    let manual = parse_manual_affinity(text, &graph, &report, &priority).unwrap();
    let placed: Vec<&str> = manual
        .nodes
        .keys()
        .map(|&n| graph.node(n).name.as_str())
        .collect();
    assert_eq!(placed, ["relu"]);
    let unplaced: Vec<(&str, &UnplacedWhy)> = manual
        .unplaced
        .iter()
        .map(|u| (u.name.as_str(), &u.why))
        .collect();
    assert_eq!(
        unplaced,
        [
            ("k", &UnplacedWhy::Constant),
            ("shape", &UnplacedWhy::Folded("Shape".into())),
            ("unused", &UnplacedWhy::Dead("Neg".into())),
        ]
    );
    assert_eq!(
        manual.unplaced[1].to_string(),
        "manual affinity 'shape' → CPU: nothing to place, it is a Shape folded into a constant by simplification"
    );

    let err = parse_manual_affinity(r#"{"nope": "CPU"}"#, &graph, &report, &priority).unwrap_err();
    assert_eq!(err.to_string(), "no node named 'nope' (manual affinity)");
}
