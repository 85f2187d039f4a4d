//! Subgraph-bearing ops (If) are single opaque nodes whose captured outer
//! tensors become implicit inputs; exported subgraphs still run in
//! onnxruntime.

use crate::util;

use std::process::Command;

use tessera_common::affinity::SupportSet;
use tessera_common::graph::Graph;
use tessera_common::onnx::proto::{
    attribute_proto::AttributeType, AttributeProto, GraphProto, ModelProto, NodeProto,
    OperatorSetIdProto,
};
use tessera_common::partition::Algorithm;
use tessera_common::synth::{node, tensor_info};

fn branch(name: &str, n: NodeProto, out: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Graph as i32),
        g: Some(GraphProto {
            name: Some(name.into()),
            node: vec![n],
            output: vec![tensor_info(out, 1, &[4])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// c = Relu(x); z = If(cond) { c + x } else { -c }; y = Sigmoid(z)
fn if_model() -> ModelProto {
    let mut if_node = node("if", "If", &["cond"], &["z"]);
    if_node.attribute = vec![
        branch(
            "then_branch",
            node("then_add", "Add", &["c", "x"], &["t"]),
            "t",
        ),
        branch("else_branch", node("else_neg", "Neg", &["c"], &["e"]), "e"),
    ];
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(GraphProto {
            name: Some("if_model".into()),
            node: vec![
                node("relu", "Relu", &["x"], &["c"]),
                if_node,
                node("sigmoid", "Sigmoid", &["z"], &["y"]),
            ],
            input: vec![tensor_info("x", 1, &[4]), tensor_info("cond", 9, &[])],
            output: vec![tensor_info("y", 1, &[4])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn if_captures_are_implicit_edges_and_export_runs() {
    let model = if_model();
    let g = Graph::from_model(model.clone()).unwrap();
    let if_id = g.op_by_name("if").unwrap();
    let captured: Vec<&str> = g
        .node(if_id)
        .implicit_inputs
        .iter()
        .map(|&t| g.tensor(t).name.as_str())
        .collect();
    assert_eq!(captured, ["c", "x"]);
    let relu = g.op_by_name("relu").unwrap();
    let edge = g.dag.find_edge(relu, if_id).expect("relu → if");
    assert!(g.dag[edge].implicit);
    // The If output type comes from its branches.
    assert_eq!(
        g.tensor(g.tensor_by_name("z").unwrap())
            .elem_type
            .map(|e| e.0),
        Some(1)
    );

    let a = util::assign_priority(
        &g,
        "HETERO:GPU,CPU",
        vec![
            ("GPU", SupportSet::from_nodes(["if"])),
            ("CPU", SupportSet::all()),
        ],
    );
    let p = util::run(&g, &a, Algorithm::Fast, true);
    assert_eq!(p.subgraphs.len(), 3);
    let if_sg = &p.subgraphs[p.subgraph_of[if_id.index()].unwrap()];
    let inputs: Vec<&str> = if_sg
        .inputs
        .iter()
        .map(|&t| g.tensor(t).name.as_str())
        .collect();
    assert_eq!(inputs, ["cond", "c", "x"]);

    let dir = std::env::temp_dir().join(format!("tessera-if-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model_path = dir.join("if_model.onnx");
    tessera_common::onnx::save_model(&model, &model_path).unwrap();
    for (i, m) in tessera_common::export::export_all(&g, &p)
        .unwrap()
        .iter()
        .enumerate()
    {
        tessera_common::onnx::save_model(m, dir.join(format!("subgraph_{i}.onnx"))).unwrap();
    }
    let plan = dir.join("plan.json");
    std::fs::write(
        &plan,
        serde_json::to_vec(&tessera_common::dump::plan_report(&g, &a, &p)).unwrap(),
    )
    .unwrap();
    for seed in ["0", "1", "2", "3"] {
        let out = Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tests/python/check_split.py"
            ))
            .args([&model_path, &plan, &dir])
            .args(["--seed", seed, "--tol", "1e-6"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
