//! HETERO in one process on real models, against onnxruntime on the same
//! seeded inputs (max abs diff ≤ 1e-4): (a) on the CPU plugin alone, (b)
//! split across two CPU plugin instances by a seeded random affinity.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use tessera_common::affinity::{DeviceId, DevicePriority, Policy};
use tessera_common::graph::Graph;
use tessera_common::onnx::load_model;
use tessera_common::partition::Algorithm;
use tessera_common::synth::Rng;
use tessera_common::tensor::{read_npy, write_npy, Tensor};
use tessera_worker::hetero::{LoadOptions, Network};
use tessera_worker::plugin::{Config, DevicePlugin};
use tessera_worker::plugins::cpu::CpuPlugin;

fn models_dir() -> PathBuf {
    std::env::var_os("TESSERA_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/models")))
}

fn random_inputs(graph: &Graph, seed: u64) -> HashMap<String, Tensor> {
    tessera_common::synth::random_inputs(graph, seed)
        .expect("numeric inputs")
        .into_iter()
        .collect()
}

fn onnxruntime(model: &Path, inputs: &HashMap<String, Tensor>, dir: &Path) -> Vec<Tensor> {
    std::fs::create_dir_all(dir).unwrap();
    let mut feeds = Vec::new();
    for (i, (name, t)) in inputs.iter().enumerate() {
        let file = dir.join(format!("in{i}.npy"));
        std::fs::write(&file, write_npy(t).unwrap()).unwrap();
        feeds.push(format!("{name:?}: np.load({:?})", file.to_str().unwrap()));
    }
    let script = format!(
        "import numpy as np, onnxruntime as ort\n\
         s = ort.InferenceSession({:?}, providers=['CPUExecutionProvider'])\n\
         for i, y in enumerate(s.run(None, {{{}}})):\n    np.save({:?} + '/out%d.npy' % i, y)",
        model.to_str().unwrap(),
        feeds.join(", "),
        dir.to_str().unwrap()
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (0..)
        .map(|i| dir.join(format!("out{i}.npy")))
        .take_while(|p| p.exists())
        .map(|p| read_npy(&std::fs::read(p).unwrap()).unwrap())
        .collect()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
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
        let path = models_dir().join(name);
        let model = load_model(&path).expect("run scripts/fetch-test-models.sh");
        let graph = Graph::from_model(model.clone()).unwrap();
        let inputs = random_inputs(&graph, 11);
        let want = onnxruntime(&path, &inputs, &tmp.join(name));
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
                .map(|((_, got), w)| max_diff(got, w))
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
