//! HETERO in one process on real models, against onnxruntime on the same
//! seeded inputs (max abs diff ≤ 1e-4): (a) on the CPU plugin alone, (b)
//! split across two CPU plugin instances by a seeded random affinity; on
//! each CPU backend (tract, onnxruntime) and on the two mixed.

use crate::util;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tessera_common::affinity::{DeviceId, DevicePriority, Policy};
use tessera_common::graph::Graph;
use tessera_common::onnx::load_model;
use tessera_common::partition::Algorithm;
use tessera_common::synth::Rng;
use tessera_common::tensor::Tensor;
use tessera_worker::hetero::{LoadOptions, Network};
use tessera_worker::plugin::{Config, DevicePlugin};

fn random_inputs(graph: &Graph, seed: u64) -> Vec<(String, Tensor)> {
    tessera_common::synth::random_inputs(graph, seed).expect("numeric inputs")
}

#[test]
fn real_models_match_onnxruntime_alone_and_split_across_two_cpus_on_tract() {
    real_models_match_onnxruntime("tract", "tract");
}

#[test]
fn real_models_match_onnxruntime_alone_and_split_across_two_cpus_on_onnxruntime() {
    real_models_match_onnxruntime("onnxruntime", "onnxruntime");
}

/// onnxruntime's CPU with tract's: tensors cross between the backends.
#[test]
fn real_models_match_onnxruntime_split_across_onnxruntime_and_tract() {
    real_models_match_onnxruntime("onnxruntime", "tract");
}

fn real_models_match_onnxruntime(first: &str, second: &str) {
    let plugins = vec![
        (
            DeviceId::parse("CPU").unwrap(),
            util::cpu_plugin(first, "CPU"),
        ),
        (
            DeviceId::parse("CPU_B").unwrap(),
            util::cpu_plugin(second, "CPU_B"),
        ),
    ];
    let tmp = std::env::temp_dir().join(format!(
        "tessera-hetero-{first}-{second}-{}",
        std::process::id()
    ));
    for name in [
        "ch_PP-OCRv4_det_infer.onnx",
        "ch_PP-OCRv4_rec_infer.onnx",
        "ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "magika_standard_v3_3.onnx",
    ] {
        let path = util::model_path(name);
        let model = load_model(&path).expect("run scripts/fetch-test-models.sh");
        let graph = Graph::from_model(model.clone()).unwrap();
        let inputs = random_inputs(&graph, 11);
        let want = util::onnxruntime(&path, &inputs, &tmp.join(name));
        let inputs: HashMap<String, Tensor> = inputs.into_iter().collect();
        // (b) a seeded random affinity over both instances.
        let mut rng = Rng::new(5);
        let manual: BTreeMap<String, DeviceId> = graph
            .topo_ops()
            .iter()
            .map(|&n| {
                let d = if rng.chance(0.5) { "CPU_B" } else { "CPU" };
                (graph.node(n).name.clone(), DeviceId::parse(d).unwrap())
            })
            .collect();
        for (label, priority, manual) in [
            ("CPU", "HETERO:CPU", BTreeMap::new()),
            ("CPU+CPU_B", "HETERO:CPU,CPU_B", manual),
        ] {
            let options = LoadOptions {
                priority: DevicePriority::parse(priority).unwrap(),
                policy: Policy::Priority,
                algorithm: Algorithm::Fast,
                strict: true,
                manual,
                config: Config::default(),
                shapes: Default::default(),
            };
            let network = Network::load(model.clone(), &plugins, &options)
                .unwrap_or_else(|e| panic!("{name} {label}: {e}"));
            let result = network
                .run(&inputs)
                .unwrap_or_else(|e| panic!("{name} {label}: {e}"));
            assert_eq!(result.outputs.len(), want.len());
            let diff = result
                .outputs
                .iter()
                .zip(&want)
                .map(|((_, got), w)| util::max_abs_diff(got, w))
                .fold(0.0, f32::max);
            println!(
                "{name} on {label} ({first}, {second}): {} subgraphs, max abs diff vs onnxruntime {diff:e}",
                network.partition().subgraphs.len()
            );
            assert!(diff <= 1e-4, "{name} {label}: {diff}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A tensor whose rank static inference cannot tell (an Einsum has no
/// shape rule) crosses a cut: the CPU plugin's own analysis (tract's, or
/// onnxruntime's type inference) reports its type and shape in
/// QueryNetwork, and the boundary is declared with them.
#[test]
fn boundaries_static_inference_cannot_type_take_tracts_analysis() {
    boundaries_take_the_backends_analysis("tract");
}

#[test]
fn boundaries_static_inference_cannot_type_take_onnxruntimes_analysis() {
    boundaries_take_the_backends_analysis("onnxruntime");
}

fn boundaries_take_the_backends_analysis(backend: &str) {
    use tessera_common::onnx::proto::{AttributeProto, GraphProto};
    use tessera_common::synth::{node, opset17, tensor_info};
    let mut g = GraphProto {
        name: Some("einsum".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[2, 3]));
    let mut einsum = node("swap", "Einsum", &["x"], &["t"]);
    einsum.attribute.push(AttributeProto {
        name: Some("equation".into()),
        s: Some(b"ij->ji".to_vec()),
        r#type: Some(3),
        ..Default::default()
    });
    g.node.push(einsum);
    g.node.push(node("relu", "Relu", &["t"], &["y"]));
    g.output.push(tensor_info("y", 1, &[3, 2]));
    let model = opset17(g);
    let plain = Graph::from_model(model.clone()).unwrap();
    let t = plain.tensor(plain.tensor_by_name("t").unwrap());
    assert_eq!(t.shape, None, "no static rule gives the Einsum's rank");

    let plugins: Vec<(DeviceId, Arc<dyn DevicePlugin>)> = ["CPU", "CPU_B"]
        .iter()
        .map(|&d| (DeviceId::parse(d).unwrap(), util::cpu_plugin(backend, d)))
        .collect();
    let mut options = LoadOptions::by_priority(DevicePriority::parse("HETERO:CPU,CPU_B").unwrap());
    options.manual = BTreeMap::from([("relu".to_string(), DeviceId::parse("CPU_B").unwrap())]);
    let network = Network::load(model, &plugins, &options).unwrap();
    assert_eq!(network.partition().subgraphs.len(), 2);
    let t = network
        .graph()
        .tensor(network.graph().tensor_by_name("t").unwrap());
    assert_eq!(t.type_string(), "float[3,2]");
    let x = Tensor::from_values(vec![2, 3], &[1f32, -2., 3., -4., 5., -6.]).unwrap();
    let result = network.run(&HashMap::from([("x".to_string(), x)])).unwrap();
    assert_eq!(
        result.outputs[0].1.to_vec::<f32>().unwrap(),
        vec![1., 0., 0., 5., 3., 0.]
    );
}
