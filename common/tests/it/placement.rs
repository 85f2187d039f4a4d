//! Placement rules that keep a split whole: a node no device supports
//! stays with its neighbours on devices of the fallback's kind, a node
//! computed from constants alone goes where it is read, and nodes joined
//! by a sequence or an optional run on one device.

use crate::util;

use std::collections::{BTreeMap, HashMap};

use tessera_common::affinity::{
    assign, AffinityRequest, AnalyticCostModel, DeviceId, DevicePriority, Policy, Rule, SupportSet,
};
use tessera_common::graph::Graph;
use tessera_common::onnx::proto::GraphProto;
use tessera_common::partition::{partition, PartitionOptions};
use tessera_common::synth::{node, opset17, tensor_info};
use tessera_common::tensor::Tensor;

/// x → a (Relu) → shape_op (Reshape: "unsupported") → c (Relu) → y.
fn chain() -> Graph {
    let mut g = GraphProto {
        name: Some("chain".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[2, 8]));
    g.initializer.push(
        Tensor::from_values(vec![2], &[4i64, 4])
            .unwrap()
            .to_proto("target"),
    );
    g.node.push(node("a", "Relu", &["x"], &["ta"]));
    g.node
        .push(node("shape_op", "Reshape", &["ta", "target"], &["tb"]));
    g.node.push(node("c", "Relu", &["tb"], &["y"]));
    g.output.push(tensor_info("y", 1, &[4, 4]));
    Graph::from_model(opset17(g)).unwrap()
}

#[test]
fn unsupported_nodes_stay_with_their_neighbours_on_same_kind_devices() {
    let g = chain();
    let both = SupportSet::from_nodes(["a", "c"]);
    let a = util::assign_priority(
        &g,
        "HETERO:node-a/CPU,node-b/CPU",
        vec![("node-a/CPU", both.clone()), ("node-b/CPU", both)],
    );
    let n = g.op_by_name("shape_op").unwrap();
    assert_eq!(a.device(n).unwrap().to_string(), "node-a/CPU");
    let p = partition(&g, &a, PartitionOptions::default()).unwrap();
    assert_eq!(p.subgraphs.len(), 1, "one device used, one subgraph");
    // Across kinds the fallback device (the last) still takes it.
    let a = util::assign_priority(
        &g,
        "HETERO:GPU,CPU",
        vec![
            ("GPU", SupportSet::from_nodes(["a", "c"])),
            ("CPU", SupportSet::from_nodes(["a", "c"])),
        ],
    );
    assert_eq!(a.device(n).unwrap().to_string(), "CPU");
    assert!(a
        .explanations
        .iter()
        .any(|e| e.node == n && e.rule == Rule::Fallback));
}

#[test]
fn nodes_computed_from_constants_follow_their_consumers() {
    let mut g = GraphProto {
        name: Some("weights".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[1, 4]));
    g.initializer.push(
        Tensor::from_values(vec![2], &[4i64, 3])
            .unwrap()
            .to_proto("w_shape"),
    );
    g.node
        .push(node("make_w", "ConstantOfShape", &["w_shape"], &["w"]));
    g.node.push(node("mm", "MatMul", &["x", "w"], &["y"]));
    g.output.push(tensor_info("y", 1, &[1, 3]));
    let g = Graph::from_model(opset17(g)).unwrap();
    // The CPU runs both and comes first; the GPU runs only the MatMul.
    // Manual affinity puts the MatMul on the GPU: the weight is made there
    // too, not sent every request.
    let priority = DevicePriority::parse("HETERO:CPU,GPU").unwrap();
    let supports = HashMap::from([
        (DeviceId::parse("CPU").unwrap(), SupportSet::all()),
        (DeviceId::parse("GPU").unwrap(), SupportSet::all()),
    ]);
    let mm = g.op_by_name("mm").unwrap();
    let manual = BTreeMap::from([(mm, DeviceId::parse("GPU").unwrap())]);
    let a = assign(
        &g,
        &AffinityRequest {
            priority: &priority,
            supports: &supports,
            manual: &manual,
            policy: Policy::Priority,
            strict: true,
            cost_model: &AnalyticCostModel::default(),
        },
    )
    .unwrap();
    let make_w = g.op_by_name("make_w").unwrap();
    assert_eq!(a.device(make_w).unwrap().to_string(), "GPU");
    assert!(a
        .explanations
        .iter()
        .any(|e| e.node == make_w && e.rule == Rule::WithConsumers));
    let p = partition(&g, &a, PartitionOptions::default()).unwrap();
    assert_eq!(p.subgraphs.len(), 1);
}

/// x → split (SplitToSequence) → at (SequenceAt, index `one`) → relu
/// (output `r`), then `more` nodes and the output `y` of shape `out`.
fn sequence_graph(more: Vec<tessera_common::onnx::proto::NodeProto>, out: &[i64]) -> Graph {
    let mut g = GraphProto {
        name: Some("seq".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[4, 2]));
    g.initializer.push(
        Tensor::from_values(vec![], &[1i64])
            .unwrap()
            .to_proto("one"),
    );
    g.node
        .push(node("split", "SplitToSequence", &["x"], &["parts"]));
    g.node
        .push(node("at", "SequenceAt", &["parts", "one"], &["part"]));
    g.node.push(node("relu", "Relu", &["part"], &["r"]));
    g.node.extend(more);
    g.output.push(tensor_info("y", 1, out));
    Graph::from_model(opset17(g)).unwrap()
}

/// x → split → at → relu → y.
fn sequence_chain() -> Graph {
    sequence_graph(vec![node("out", "Identity", &["r"], &["y"])], &[1, 2])
}

#[test]
fn nodes_joined_by_a_sequence_run_on_one_device() {
    let g = sequence_chain();
    // The GPU makes the sequence but cannot read it: both go to the CPU,
    // the only device that runs them both.
    let a = util::assign_priority(
        &g,
        "HETERO:GPU,CPU",
        vec![
            ("GPU", SupportSet::from_nodes(["split", "relu"])),
            ("CPU", SupportSet::all()),
        ],
    );
    let on = |name: &str| a.device(g.op_by_name(name).unwrap()).unwrap();
    assert_eq!(on("split").to_string(), "CPU");
    assert_eq!(on("at").to_string(), "CPU");
    assert_eq!(on("relu").to_string(), "GPU");
    assert!(a
        .explanations
        .iter()
        .any(|e| g.node(e.node).name == "split" && e.rule == Rule::WithCollection));
    // Where the maker's device runs the readers, they join it.
    let a = util::assign_priority(
        &g,
        "HETERO:GPU,CPU",
        vec![
            ("GPU", SupportSet::from_nodes(["split", "at"])),
            ("CPU", SupportSet::from_nodes(["relu"])),
        ],
    );
    let on = |name: &str| a.device(g.op_by_name(name).unwrap()).unwrap().to_string();
    assert_eq!(
        (on("split"), on("at"), on("relu")),
        ("GPU".into(), "GPU".into(), "CPU".into())
    );
    let p = partition(&g, &a, PartitionOptions::default()).unwrap();
    assert_eq!(p.subgraphs.len(), 2);
    // A manual affinity that cuts the sequence is refused, naming it.
    let priority = DevicePriority::parse("HETERO:GPU,CPU").unwrap();
    let supports: HashMap<DeviceId, SupportSet> = [
        (DeviceId::parse("GPU").unwrap(), SupportSet::all()),
        (DeviceId::parse("CPU").unwrap(), SupportSet::all()),
    ]
    .into();
    let manual: BTreeMap<_, _> = [
        (
            g.op_by_name("split").unwrap(),
            DeviceId::parse("GPU").unwrap(),
        ),
        (g.op_by_name("at").unwrap(), DeviceId::parse("CPU").unwrap()),
    ]
    .into();
    let err = assign(
        &g,
        &AffinityRequest {
            priority: &priority,
            supports: &supports,
            manual: &manual,
            policy: Policy::Priority,
            strict: false,
            cost_model: &AnalyticCostModel::default(),
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("'parts' is a sequence, an optional"), "{err}");
    assert!(err.contains("different devices"), "{err}");
}

#[test]
fn a_node_between_two_readers_of_a_sequence_joins_them() {
    // split → at → relu → insert(parts, relu's output) → concat: relu lies
    // on a path between two nodes that share the sequence, so it runs with
    // them though the GPU comes first for it.
    let mut concat = node("concat", "ConcatFromSequence", &["more"], &["y"]);
    concat
        .attribute
        .push(tessera_common::onnx::proto::AttributeProto {
            name: Some("axis".into()),
            i: Some(0),
            r#type: Some(tessera_common::onnx::proto::attribute_proto::AttributeType::Int as i32),
            ..Default::default()
        });
    let g = sequence_graph(
        vec![
            node("insert", "SequenceInsert", &["parts", "r"], &["more"]),
            concat,
        ],
        &[5, 2],
    );
    let a = util::assign_priority(
        &g,
        "HETERO:GPU,CPU",
        vec![
            ("GPU", SupportSet::from_nodes(["relu"])),
            ("CPU", SupportSet::all()),
        ],
    );
    for name in ["split", "at", "relu", "insert", "concat"] {
        let device = a.device(g.op_by_name(name).unwrap()).unwrap();
        assert_eq!(device.to_string(), "CPU", "{name}");
    }
    let p = partition(&g, &a, PartitionOptions::default()).unwrap();
    assert_eq!(p.subgraphs.len(), 1);
}

#[test]
fn a_sequence_at_the_graph_boundary_is_refused_by_name() {
    use tessera_common::plan::{plan, PlanError, PlanOptions};
    // x → split → parts, returned as the graph's output.
    let mut g = GraphProto {
        name: Some("seq-out".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[4, 2]));
    g.node
        .push(node("split", "SplitToSequence", &["x"], &["parts"]));
    g.output
        .push(tessera_common::onnx::sequence_info("parts", 1));
    let g = Graph::from_model(opset17(g)).unwrap();
    let supports: HashMap<DeviceId, SupportSet> =
        [(DeviceId::parse("CPU").unwrap(), SupportSet::all())].into();
    let options = PlanOptions {
        priority: DevicePriority::parse("HETERO:CPU").unwrap(),
        ..Default::default()
    };
    let err = plan(&g, &supports, &AnalyticCostModel::default(), &options).unwrap_err();
    assert!(
        matches!(&err, PlanError::CollectionAtGraphBoundary { role: "output", name } if name == "parts"),
        "{err}"
    );
    assert!(err.to_string().contains("infer_values"), "{err}");
}
