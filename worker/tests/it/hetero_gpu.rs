//! HETERO:GPU,CPU in one process on real models (rapidocr-onnxruntime
//! 1.4.4's PP-OCRv4 det / rec and PP-OCR cls, magika 1.0.3): the nodes the
//! GPU plugin supports run on it, the rest on the CPU plugin; outputs
//! against onnxruntime on the same seeded inputs (max abs diff ≤ 1e-3).
//! Skipped, saying so, without a GPU adapter unless TESSERA_GPU_TESTS=required.

use crate::util;

use std::collections::HashMap;
use std::sync::Arc;

use tessera_common::affinity::{DeviceId, DevicePriority};
use tessera_common::graph::Graph;
use tessera_common::onnx::load_model;
use tessera_common::tensor::Tensor;
use tessera_worker::hetero::{LoadOptions, Network};
use tessera_worker::plugin::DevicePlugin;
use tessera_worker::plugins::cpu::CpuPlugin;

const TOLERANCE: f32 = 1e-3;

#[test]
fn real_models_split_between_gpu_and_cpu_match_onnxruntime() {
    let Some(gpu) = util::gpu_plugin() else {
        return;
    };
    let plugins: Vec<(DeviceId, Arc<dyn DevicePlugin>)> = vec![
        (DeviceId::parse("GPU").unwrap(), Arc::new(gpu)),
        (
            DeviceId::parse("CPU").unwrap(),
            Arc::new(CpuPlugin::new().unwrap()),
        ),
    ];
    let tmp = std::env::temp_dir().join(format!("tessera-hetero-gpu-{}", std::process::id()));
    for name in [
        "ch_PP-OCRv4_det_infer.onnx",
        "ch_PP-OCRv4_rec_infer.onnx",
        "ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "magika_standard_v3_3.onnx",
    ] {
        let path = util::model_path(name);
        let model = load_model(&path).expect("run scripts/fetch-test-models.sh");
        let graph = Graph::from_model(model.clone()).unwrap();
        let inputs = tessera_common::synth::random_inputs(&graph, 11).expect("numeric inputs");
        let want = util::onnxruntime(&path, &inputs, &tmp.join(name));
        let inputs: HashMap<String, Tensor> = inputs.into_iter().collect();
        let options = LoadOptions::by_priority(DevicePriority::parse("HETERO:GPU,CPU").unwrap());
        let network =
            Network::load(model, &plugins, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
        let part = network.partition();
        let mut on: HashMap<String, usize> = HashMap::new();
        for sg in &part.subgraphs {
            *on.entry(part.device_of(sg).to_string()).or_default() += sg.nodes.len();
        }
        let result = network
            .run(&inputs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let diff = result
            .outputs
            .iter()
            .zip(&want)
            .map(|((_, got), w)| util::max_abs_diff(got, w))
            .fold(0.0, f32::max);
        let (g, c) = (
            on.get("GPU").copied().unwrap_or(0),
            on.get("CPU").copied().unwrap_or(0),
        );
        println!(
            "{name}: {} subgraphs, {g} nodes on GPU, {c} on CPU; max abs diff vs onnxruntime {diff:e}",
            part.subgraphs.len()
        );
        assert!(diff <= TOLERANCE, "{name}: max abs diff {diff}");
        assert!(g > 0, "{name}: nothing ran on the GPU");
    }
}
