//! The cost policy: compute + transfer estimates decide between devices,
//! deterministically, and the explanation carries the numbers.

use std::collections::{BTreeMap, HashMap};

use tessera_common::affinity::{
    assign, AffinityRequest, AnalyticCostModel, Assignment, DeviceId, DevicePriority, Policy, Rule,
    SupportSet,
};
use tessera_common::graph::Graph;
use tessera_common::onnx::proto::{GraphProto, ModelProto, OperatorSetIdProto, TensorProto};
use tessera_common::synth::{node, tensor_info};

/// x[512,512] → MatMul(W) → Relu → Sqrt(tiny tail on [1]) …
fn model() -> Graph {
    let n = 512;
    let g = GraphProto {
        name: Some("cost".into()),
        node: vec![
            node("mm", "MatMul", &["x", "w"], &["y"]),
            node("relu", "Relu", &["y"], &["r"]),
            node("pre", "Abs", &["s"], &["s1"]),
            node("mid", "Neg", &["s1"], &["s2"]),
            node("post", "Sqrt", &["s2"], &["s3"]),
        ],
        input: vec![tensor_info("x", 1, &[n, n]), tensor_info("s", 1, &[1])],
        output: vec![tensor_info("r", 1, &[n, n]), tensor_info("s3", 1, &[1])],
        initializer: vec![TensorProto {
            name: Some("w".into()),
            dims: vec![n, n],
            data_type: Some(1),
            raw_data: Some(vec![0u8; (n * n * 4) as usize].into()),
            ..Default::default()
        }],
        ..Default::default()
    };
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(g),
        ..Default::default()
    };
    Graph::from_model(m).unwrap()
}

fn run(g: &Graph, policy: Policy) -> Assignment {
    let priority = DevicePriority::parse("HETERO:CPU,GPU").unwrap();
    let supports = HashMap::from([
        (DeviceId::parse("CPU").unwrap(), SupportSet::all()),
        // The GPU runs everything but the tiny chain's ends.
        (
            DeviceId::parse("GPU").unwrap(),
            SupportSet::from_nodes(["mm", "relu", "mid"]),
        ),
    ]);
    let cost = AnalyticCostModel::default();
    assign(
        g,
        &AffinityRequest {
            priority: &priority,
            supports: &supports,
            manual: &BTreeMap::new(),
            policy,
            strict: true,
            cost_model: &cost,
        },
    )
    .unwrap()
}

fn device_of(g: &Graph, a: &Assignment, name: &str) -> String {
    a.device(g.op_by_name(name).unwrap()).unwrap().to_string()
}

#[test]
fn priority_takes_the_first_supporting_device() {
    let g = model();
    let a = run(&g, Policy::Priority);
    for n in ["mm", "relu", "pre", "mid", "post"] {
        assert_eq!(device_of(&g, &a, n), "CPU", "{n}");
    }
}

#[test]
fn cost_moves_heavy_work_to_the_gpu_and_keeps_cheap_work_near_its_data() {
    let g = model();
    let a = run(&g, Policy::Cost);
    // 268 MFLOP: ~5.4 ms on the default CPU profile, ~0.13 ms on the GPU.
    assert_eq!(device_of(&g, &a, "mm"), "GPU");
    // Its input is on the GPU; moving 1 MiB back would cost more than it saves.
    assert_eq!(device_of(&g, &a, "relu"), "GPU");
    // A tiny op between two CPU-only ops stays on the CPU: the transfer
    // latency outweighs any compute gain.
    assert_eq!(device_of(&g, &a, "mid"), "CPU");
    let mm = a
        .explanations
        .iter()
        .find(|e| g.node(e.node).name == "mm")
        .unwrap();
    let Rule::Cost { estimates } = &mm.rule else {
        panic!("{:?}", mm.rule)
    };
    assert_eq!(estimates[0].device, "GPU");
    assert!(estimates[0].total_us < estimates[1].total_us);
    assert!(
        estimates[1].compute_us > 5000.0 && estimates[1].compute_us < 6000.0,
        "{estimates:?}"
    );
    let text = a.explain(&g, mm);
    assert!(
        text.contains("mm [MatMul]: supported on [CPU, GPU] -> GPU by cost (GPU:"),
        "{text}"
    );
    // Deterministic.
    let again = run(&g, Policy::Cost);
    assert_eq!(a.explanations, again.explanations);
}

#[test]
fn transfer_costs_depend_on_hosts() {
    use tessera_common::affinity::CostModel;
    let m = AnalyticCostModel::default();
    let d = |s: &str| DeviceId::parse(s).unwrap();
    let mb = 1 << 20;
    assert_eq!(m.transfer_us(mb, &d("a/CPU"), &d("a/CPU")), 0.0);
    let same_host = m.transfer_us(mb, &d("a/CPU"), &d("a/GPU.0"));
    let other_host = m.transfer_us(mb, &d("a/CPU"), &d("b/CPU"));
    assert!(
        same_host > 0.0 && other_host > same_host * 5.0,
        "{same_host} {other_host}"
    );
}
