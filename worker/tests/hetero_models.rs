//! HETERO in one process on real models, against onnxruntime on the same
//! seeded inputs (max abs diff ≤ 1e-4): (a) on the CPU plugin alone, (b)
//! split across two CPU plugin instances by a seeded random affinity.

mod util;

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
use tessera_worker::plugins::cpu::CpuPlugin;

fn random_inputs(graph: &Graph, seed: u64) -> Vec<(String, Tensor)> {
    tessera_common::synth::random_inputs(graph, seed).expect("numeric inputs")
}

#[test]
fn real_models_match_onnxruntime_alone_and_split_across_two_cpus() {
    let cpu: Arc<dyn DevicePlugin> = Arc::new(CpuPlugin::new().unwrap());
    let cpu_b: Arc<dyn DevicePlugin> = Arc::new(CpuPlugin::named("CPU_B").unwrap());
    let plugins = vec![
        (DeviceId::parse("CPU").unwrap(), cpu),
        (DeviceId::parse("CPU_B").unwrap(), cpu_b),
    ];
    let tmp = std::env::temp_dir().join(format!("tessera-hetero-{}", std::process::id()));
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
                "{name} on {label}: {} subgraphs, max abs diff vs onnxruntime {diff:e}",
                network.partition().subgraphs.len()
            );
            assert!(diff <= 1e-4, "{name} {label}: {diff}");
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
