//! Bad input gets a clear error, never a panic.

use crate::util;

use std::collections::{BTreeMap, HashMap};

use crate::util::graph_from;
use prost::Message;
use tessera_common::affinity::{
    assign, parse_manual_affinity, AffinityError, AffinityRequest, AnalyticCostModel, DeviceId,
    DevicePriority, Policy, SupportSet,
};
use tessera_common::graph::{Graph, GraphError};
use tessera_common::onnx::proto::{
    tensor_proto::DataLocation, StringStringEntryProto, TensorProto,
};
use tessera_common::onnx::{decode_model, load_model, save_model, OnnxError};
use tessera_common::synth::{model_from_dag, Dag, Rng};

fn chain_model() -> tessera_common::onnx::proto::ModelProto {
    model_from_dag(
        &Dag {
            nodes: 3,
            edges: vec![(0, 1), (1, 2)],
        },
        Some(&["a", "b", "c"]),
    )
}

#[test]
fn truncated_garbage_and_empty_files_are_clear_errors() {
    let bytes = chain_model().encode_to_vec();
    let err = decode_model(&bytes[..bytes.len() / 2]).unwrap_err();
    assert!(matches!(err, OnnxError::Decode { .. }), "{err}");
    assert!(err.to_string().contains("not a valid ONNX model"), "{err}");
    let err = decode_model(b"\xff\xfe this is not protobuf at all").unwrap_err();
    assert!(err.to_string().contains("not a valid ONNX model"), "{err}");
    let err = decode_model(&[]).unwrap_err();
    assert!(err.to_string().contains("no graph"), "{err}");
    let err = load_model("/nonexistent/model.onnx").unwrap_err();
    assert!(err.to_string().contains("/nonexistent/model.onnx"), "{err}");
}

#[test]
fn corrupted_real_model_bytes_never_panic() {
    let path = util::real_models().into_iter().nth(2).unwrap();
    let original = std::fs::read(path).unwrap();
    let mut rng = Rng::new(7);
    let mut decoded = 0;
    for _ in 0..300 {
        let mut bytes = original.clone();
        for _ in 0..1 + rng.below(8) {
            let i = rng.below(bytes.len() as u64) as usize;
            bytes[i] = rng.below(256) as u8;
        }
        if rng.chance(0.2) {
            bytes.truncate(rng.below(bytes.len() as u64) as usize);
        }
        if let Ok(model) = decode_model(&bytes) {
            decoded += 1;
            let _ = Graph::from_model(model);
        }
    }
    assert!(
        decoded > 0,
        "some corruptions still decode and must go through the graph builder"
    );
}

#[test]
fn broken_graphs_are_rejected_with_names() {
    let mut m = chain_model();
    m.graph.as_mut().unwrap().node[1].input = vec!["missing".into()];
    match Graph::from_model(m).unwrap_err() {
        GraphError::UndefinedInput { node, tensor } => {
            assert_eq!((node.as_str(), tensor.as_str()), ("b", "missing"))
        }
        e => panic!("{e}"),
    }
    let mut m = chain_model();
    m.graph.as_mut().unwrap().node[2].output = vec!["t0".into()];
    assert!(matches!(
        Graph::from_model(m).unwrap_err(),
        GraphError::DuplicateProducer { .. }
    ));
    let mut m = chain_model();
    m.graph.as_mut().unwrap().node[0].input = vec!["t2".into()];
    let err = Graph::from_model(m).unwrap_err();
    assert!(matches!(err, GraphError::Cycle(_)), "{err}");
    let mut m = chain_model();
    m.graph.as_mut().unwrap().output[0].name = Some("nope".into());
    assert!(matches!(
        Graph::from_model(m).unwrap_err(),
        GraphError::UndefinedOutput(_)
    ));
}

#[test]
fn unnamed_and_duplicate_nodes_get_stable_unique_names() {
    let mut m = model_from_dag(
        &Dag {
            nodes: 4,
            edges: vec![(0, 1), (1, 2), (2, 3)],
        },
        Some(&["", "x", "x", "Sum_0"]),
    );
    m.graph.as_mut().unwrap().node[0].name = None;
    let g = Graph::from_model(m).unwrap();
    let names: Vec<&str> = g
        .topo_ops()
        .iter()
        .map(|&n| g.node(n).name.as_str())
        .collect();
    assert_eq!(names, ["Sum_0_1", "x", "x_2", "Sum_0"]);
    let exported: Vec<&str> = g
        .model()
        .graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .map(|n| n.name.as_deref().unwrap())
        .collect();
    assert_eq!(exported, names);
}

fn request_parts(g: &Graph) -> (DevicePriority, HashMap<DeviceId, SupportSet>) {
    let priority = DevicePriority::parse("HETERO:GPU,CPU").unwrap();
    let supports = HashMap::from([
        (
            DeviceId::parse("GPU").unwrap(),
            SupportSet::parse("a\nop:Missing\n# comment\n\nc", g, "gpu.txt").unwrap(),
        ),
        (
            DeviceId::parse("CPU").unwrap(),
            SupportSet::from_nodes(["a", "c"]),
        ),
    ]);
    (priority, supports)
}

#[test]
fn affinity_errors_name_the_culprit() {
    let g = graph_from(3, &[(0, 1), (1, 2)], Some(&["a", "b", "c"]));
    let (priority, supports) = request_parts(&g);
    // Unknown node in a supports file, with its line.
    let err = SupportSet::parse("a\nzzz", &g, "gpu.txt").unwrap_err();
    assert_eq!(err.to_string(), "no node named 'zzz' (gpu.txt, line 2)");
    // Manual affinity: unknown node, unknown device, device that does not support the node.
    let none = tessera_common::simplify::SimplifyReport::default();
    let err = parse_manual_affinity(r#"{"nope": "GPU"}"#, &g, &none, &priority).unwrap_err();
    assert!(matches!(err, AffinityError::UnknownNode { .. }), "{err}");
    let err = parse_manual_affinity(r#"{"a": "NPU"}"#, &g, &none, &priority).unwrap_err();
    assert!(
        err.to_string().contains("unknown device 'NPU'") && err.to_string().contains("GPU, CPU"),
        "{err}"
    );
    let err = parse_manual_affinity(r#"{"a": "gpu"}"#, &g, &none, &priority).unwrap_err();
    assert!(err.to_string().contains('^'), "{err}");
    let err = parse_manual_affinity("[1, 2]", &g, &none, &priority).unwrap_err();
    assert!(matches!(err, AffinityError::BadFile(_)));
    let manual = parse_manual_affinity(r#"{"affinity": {"b": "GPU"}}"#, &g, &none, &priority)
        .unwrap()
        .nodes;
    let cost = AnalyticCostModel::default();
    let req = |manual: &BTreeMap<_, _>, strict| {
        assign(
            &g,
            &AffinityRequest {
                priority: &priority,
                supports: &supports,
                manual,
                policy: Policy::Priority,
                strict,
                cost_model: &cost,
            },
        )
    };
    let err = req(&manual, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "manual affinity puts node 'b' on GPU, which does not support it"
    );
    // Strict: every unsupported node is listed; otherwise they fall back to the last device.
    let err = req(&BTreeMap::new(), true).unwrap_err();
    assert_eq!(
        err.to_string(),
        "strict mode: 1 node(s) are supported by no device: b"
    );
    let a = req(&BTreeMap::new(), false).unwrap();
    let b = g.op_by_name("b").unwrap();
    assert_eq!(a.device(b).unwrap().to_string(), "CPU");
    assert!(a.explain(&g, &a.explanations[1]).contains("fallback"));
    // A support set for a device outside the priority list.
    let mut extra = supports.clone();
    extra.insert(DeviceId::parse("NPU").unwrap(), SupportSet::all());
    let err = assign(
        &g,
        &AffinityRequest {
            priority: &priority,
            supports: &extra,
            manual: &BTreeMap::new(),
            policy: Policy::Priority,
            strict: false,
            cost_model: &cost,
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("unknown device 'NPU'"), "{err}");
}

#[test]
fn external_data_is_read_and_checked() {
    let dir = std::env::temp_dir().join(format!("tessera-ext-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let payload: Vec<u8> = (0..16u8).collect();
    std::fs::write(dir.join("weights.bin"), [&[9u8; 4][..], &payload].concat()).unwrap();
    let external = |location: &str, offset: &str, length: &str| {
        let mut m = chain_model();
        let entry = |k: &str, v: &str| StringStringEntryProto {
            key: Some(k.into()),
            value: Some(v.into()),
        };
        m.graph.as_mut().unwrap().initializer.push(TensorProto {
            name: Some("w".into()),
            dims: vec![4],
            data_type: Some(1),
            data_location: Some(DataLocation::External as i32),
            external_data: vec![
                entry("location", location),
                entry("offset", offset),
                entry("length", length),
            ],
            ..Default::default()
        });
        let path = dir.join("model.onnx");
        save_model(&m, &path).unwrap();
        load_model(&path)
    };
    let m = external("weights.bin", "4", "16").unwrap();
    let w = &m.graph.unwrap().initializer[0];
    assert_eq!(w.raw_data.as_deref(), Some(&payload[..]));
    assert_eq!(w.data_location, Some(DataLocation::Default as i32));
    for (loc, off, len, expect) in [
        ("missing.bin", "0", "4", "cannot read"),
        ("../etc/passwd", "0", "4", "relative path inside"),
        ("/etc/passwd", "0", "4", "relative path inside"),
        ("weights.bin", "8", "64", "outside"),
        ("weights.bin", "x", "4", "not a number"),
    ] {
        let err = external(loc, off, len).unwrap_err();
        assert!(err.to_string().contains(expect), "{loc}: {err}");
        assert!(err.to_string().contains("'w'"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
