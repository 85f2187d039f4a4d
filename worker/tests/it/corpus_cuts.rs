//! Property test over the real-model corpus: seeded random valid cuts of
//! each model into 2–4 subgraphs (contiguous runs of the topological
//! order, each on one of 2–3 CPU plugin instances by manual affinity, on
//! each CPU backend: tract, and onnxruntime) all
//! export, compile and match onnxruntime on the same inputs (|diff| ≤ 1e-4
//! × max(1, max |onnxruntime|)); the first cut's exported subgraphs pass
//! `onnx.checker` with `full_check`. A failure names the model, the cut (its
//! segments and devices) and the boundary tensors.

use crate::util;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tessera_common::affinity::{DeviceId, DevicePriority};
use tessera_common::onnx::load_model;
use tessera_common::plan::prepare;
use tessera_common::synth::Rng;
use tessera_common::tensor::Tensor;
use tessera_worker::hetero::{LoadOptions, Network};
use tessera_worker::plugin::DevicePlugin;

/// The corpus with the number of cuts each gets ([`cuts_on`] takes a
/// third of them on tract): 20, and 6 for the three
/// classic CNNs whose single run costs several seconds of tract compute on
/// two cores (their 200–550 MB of weights are made by ConstantOfShape).
const CORPUS: &[(&str, usize)] = &[
    ("ch_PP-OCRv4_det_infer.onnx", 20),
    ("ch_PP-OCRv4_rec_infer.onnx", 20),
    ("ch_ppocr_mobile_v2.0_cls_infer.onnx", 20),
    ("magika_standard_v3_3.onnx", 20),
    ("light_bvlc_alexnet.onnx", 6),
    ("light_densenet121.onnx", 20),
    ("light_inception_v1.onnx", 20),
    ("light_inception_v2.onnx", 20),
    ("light_resnet50.onnx", 20),
    ("light_shufflenet.onnx", 20),
    ("light_squeezenet.onnx", 20),
    ("light_vgg19.onnx", 6),
    ("light_zfnet512.onnx", 6),
    ("paraphrase-MiniLM-L3-v2.onnx", 20),
    ("silero_vad_16k_sequence.onnx", 20),
];

/// Largest absolute difference; integer and boolean outputs must be
/// equal (else infinite), as must shapes and element types.
fn difference(got: &Tensor, want: &Tensor) -> f32 {
    if got.shape() != want.shape() || got.elem() != want.elem() {
        return f32::INFINITY;
    }
    match (got.float_values(), want.float_values()) {
        (Some(_), Some(_)) => util::max_abs_diff(got, want),
        _ if got.bytes() == want.bytes() => 0.0,
        _ => f32::INFINITY,
    }
}

const DEVICES: [&str; 3] = ["CPU", "CPU_B", "CPU_C"];

/// The cuts a model gets on `backend`, and their seed. tract runs a cut
/// about eight times slower than onnxruntime on two cores (the corpus's
/// cuts took 283 s against 35 s on an AVX-512 host, and three times as
/// long on an AVX2 one), so it gets a third as many, drawn from a seed of
/// its own: the two backends together cover different cuts.
fn cuts_on(backend: &str, cuts: usize) -> (usize, u64) {
    if backend == "tract" {
        (cuts.div_ceil(3), 2027)
    } else {
        (cuts, 2026)
    }
}

/// A random cut: 2–4 contiguous segments of the topological order, each on
/// one of the first 2–3 devices (neighbouring segments on different ones).
fn random_cut(ops: usize, rng: &mut Rng) -> Vec<(usize, &'static str)> {
    let segments = 2 + rng.below(3) as usize;
    let devices = 2 + rng.below(2) as usize;
    let mut starts: Vec<usize> = vec![0];
    while starts.len() < segments.min(ops) {
        let s = 1 + rng.below(ops as u64 - 1) as usize;
        if !starts.contains(&s) {
            starts.push(s);
        }
    }
    starts.sort_unstable();
    let mut cut: Vec<(usize, &'static str)> = Vec::new();
    for s in starts {
        let mut d = DEVICES[rng.below(devices as u64) as usize];
        if cut.last().is_some_and(|&(_, prev)| prev == d) {
            d = DEVICES[(DEVICES.iter().position(|&x| x == d).unwrap_or(0) + 1) % devices];
        }
        cut.push((s, d));
    }
    cut
}

/// The network's subgraphs, exported again, pass
/// `onnx.checker.check_model(full_check=True)`.
fn check_exported(network: &Network, dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let models = tessera_common::export::export_all(network.graph(), network.partition())
        .map_err(|e| e.to_string())?;
    let mut paths = Vec::new();
    for (i, m) in models.iter().enumerate() {
        let path = dir.join(format!("subgraph_{i}.onnx"));
        tessera_common::onnx::save_model(m, &path).map_err(|e| e.to_string())?;
        paths.push(path);
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys, onnx\nfor p in sys.argv[1:]:\n    onnx.checker.check_model(onnx.load(p), full_check=True)",
        ])
        .args(&paths)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    let _ = std::fs::remove_dir_all(dir);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "onnx.checker (full) refuses an exported subgraph: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ))
    }
}

/// tract's cuts are two tests of about equal time, so that the harness's
/// two threads share them: as one test it ran 218 s on an AVX-512 host
/// while the binary's other tests were done in about 100 (these models'
/// cuts took 112 s of it, the others 105).
const TRACT_FIRST_HALF: &[&str] = &[
    "light_vgg19.onnx",
    "light_resnet50.onnx",
    "light_inception_v2.onnx",
    "light_inception_v1.onnx",
    "ch_PP-OCRv4_det_infer.onnx",
];

#[test]
fn random_cuts_of_every_corpus_model_match_onnxruntime_on_tract_first_half() {
    random_cuts_match_onnxruntime("tract", "first", |m| TRACT_FIRST_HALF.contains(&m));
}

#[test]
fn random_cuts_of_every_corpus_model_match_onnxruntime_on_tract_second_half() {
    random_cuts_match_onnxruntime("tract", "second", |m| !TRACT_FIRST_HALF.contains(&m));
}

#[test]
fn random_cuts_of_every_corpus_model_match_onnxruntime_on_onnxruntime() {
    random_cuts_match_onnxruntime("onnxruntime", "all", |_| true);
}

/// The cuts of the corpus's models that `part` (named `label`) takes.
fn random_cuts_match_onnxruntime(backend: &str, label: &str, part: impl Fn(&str) -> bool) {
    let plugins: Vec<(DeviceId, Arc<dyn DevicePlugin>)> = DEVICES
        .iter()
        .map(|&d| (DeviceId::parse(d).unwrap(), util::cpu_plugin(backend, d)))
        .collect();
    let tmp = std::env::temp_dir().join(format!(
        "tessera-cuts-{backend}-{label}-{}",
        std::process::id()
    ));
    let mut failures = Vec::new();
    for &(name, cuts) in CORPUS.iter().filter(|(name, _)| part(name)) {
        let started = std::time::Instant::now();
        let path = util::model_path(name);
        let model = load_model(&path).expect("run scripts/fetch-test-models.sh");
        let (graph, _) = prepare(&model, &BTreeMap::new()).unwrap();
        let inputs = tessera_common::synth::random_inputs(&graph, 3).expect("numeric inputs");
        let want = util::onnxruntime(&path, &inputs, &tmp.join(name));
        let scale = want
            .iter()
            .filter_map(Tensor::float_values)
            .flatten()
            .fold(1.0f32, |m, v| m.max(v.abs()));
        let inputs: HashMap<String, Tensor> = inputs.into_iter().collect();
        let ops: Vec<String> = graph
            .topo_ops()
            .iter()
            .map(|&n| graph.node(n).name.clone())
            .collect();
        let (cuts, seed) = cuts_on(backend, cuts);
        let mut rng = Rng::new(seed);
        for k in 0..cuts {
            let cut = random_cut(ops.len(), &mut rng);
            let mut manual = BTreeMap::new();
            for (i, &(start, device)) in cut.iter().enumerate() {
                let end = cut.get(i + 1).map_or(ops.len(), |&(s, _)| s);
                for op in &ops[start..end] {
                    manual.insert(op.clone(), DeviceId::parse(device).unwrap());
                }
            }
            let mut options = LoadOptions::by_priority(
                DevicePriority::parse(&format!("HETERO:{}", DEVICES.join(","))).unwrap(),
            );
            options.manual = manual;
            let outcome = Network::load(model.clone(), &plugins, &options)
                .map_err(|e| e.to_string())
                .and_then(|network| {
                    let boundaries: Vec<String> = network
                        .partition()
                        .subgraphs
                        .iter()
                        .flat_map(|sg| sg.inputs.iter())
                        .map(|&t| network.graph().tensor(t).name.clone())
                        .collect();
                    if k == 0 {
                        check_exported(&network, &tmp.join(format!("{name}-cut0")))?;
                    }
                    let result = network
                        .run(&inputs)
                        .map_err(|e| format!("{e} (boundaries: {})", boundaries.join(", ")))?;
                    let diff = result
                        .outputs
                        .iter()
                        .zip(&want)
                        .map(|((_, got), w)| difference(got, w))
                        .fold(0.0, f32::max);
                    if diff > 1e-4 * scale || diff.is_nan() {
                        return Err(format!(
                            "differs by {diff:e} (boundaries: {})",
                            boundaries.join(", ")
                        ));
                    }
                    Ok(network.partition().subgraphs.len())
                });
            let took = started.elapsed().as_secs_f64();
            match outcome {
                Ok(n) => println!(
                    "{backend}: {name} cut {k} {cut:?}: {n} subgraphs, matches ({took:.0} s)"
                ),
                Err(e) => {
                    println!("{backend}: {name} cut {k} {cut:?}: FAILED {e}");
                    failures.push(format!("{backend}: {name} cut {k} at {cut:?}: {e}"));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
