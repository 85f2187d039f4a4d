//! The onnxruntime CPU device against onnxruntime itself (a figure
//! printer, not a timed test):
//! `cargo bench -p tessera-worker --bench onnxruntime`.
//!
//! For each model, the same seeded inputs through Tessera's HETERO:CPU
//! path on the onnxruntime plugin vs an onnxruntime session called
//! directly (the same library, one intra-op thread, all graph
//! optimizations, as a user of onnxruntime would), and tract's plugin for
//! reference. Runs alternate so that noise on a shared machine hits all
//! alike; prints medians and the ratios (target: Tessera/onnxruntime
//! ≤ 1.05).

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use ort::value::DynTensor;
use tessera_common::affinity::{DeviceId, DevicePriority};
use tessera_common::onnx::ElemType;
use tessera_common::synth::Rng;
use tessera_common::tensor::Tensor;
use tessera_worker::hetero::{LoadOptions, Network};
use tessera_worker::plugin::DevicePlugin;
use tessera_worker::plugins::{self, onnxruntime::library, CpuBackend, PluginOptions};

type Error = Box<dyn std::error::Error>;
/// An input: name, element type, shape.
type InputSpec<'a> = (&'a str, ElemType, Vec<usize>);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seeded inputs: floats in [-1, 1) for images, ids below 1000 for
/// tokens, bytes for magika, ones for attention masks.
fn inputs(
    specs: &[(&str, ElemType, Vec<usize>)],
    seed: u64,
) -> Result<Vec<(String, Tensor)>, Error> {
    let mut rng = Rng::new(seed);
    specs
        .iter()
        .map(|(name, elem, shape)| {
            let n: usize = shape.iter().product();
            let t = match *elem {
                ElemType::FLOAT => {
                    let v: Vec<f32> = (0..n)
                        .map(|_| rng.below(2000) as f32 / 1000.0 - 1.0)
                        .collect();
                    Tensor::from_values(shape.clone(), &v)?
                }
                ElemType::INT32 => {
                    let v: Vec<i32> = (0..n).map(|_| rng.below(256) as i32).collect();
                    Tensor::from_values(shape.clone(), &v)?
                }
                _ if name.contains("mask") => Tensor::from_values(shape.clone(), &vec![1i64; n])?,
                _ => {
                    let v: Vec<i64> = (0..n).map(|_| rng.below(1000) as i64).collect();
                    Tensor::from_values(shape.clone(), &v)?
                }
            };
            Ok((name.to_string(), t))
        })
        .collect()
}

fn hetero(path: &std::path::Path, backend: CpuBackend) -> Result<Network, Error> {
    let options = PluginOptions {
        cpu_backend: backend,
        onnxruntime_library: None,
        calibration_dir: None,
    };
    let cpu: Arc<dyn DevicePlugin> = plugins::cpu_plugin("CPU", &options)?;
    let model = tessera_common::onnx::load_model(path)?;
    Ok(Network::load(
        model,
        &[(DeviceId::parse("CPU")?, cpu)],
        &LoadOptions::by_priority(DevicePriority::parse("HETERO:CPU")?),
    )?)
}

/// One direct onnxruntime run, inputs made from the tensors as a caller
/// would make them from its arrays.
fn run_direct(session: &mut Session, feeds: &[(String, Tensor)]) -> Result<(), Error> {
    let mut values: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = Vec::new();
    for (name, t) in feeds {
        let value: DynTensor = match t.elem() {
            ElemType::FLOAT => {
                ort::value::Tensor::from_array((t.shape().to_vec(), t.to_vec::<f32>()?))?.upcast()
            }
            ElemType::INT32 => {
                ort::value::Tensor::from_array((t.shape().to_vec(), t.to_vec::<i32>()?))?.upcast()
            }
            _ => ort::value::Tensor::from_array((t.shape().to_vec(), t.to_vec::<i64>()?))?.upcast(),
        };
        values.push((Cow::Borrowed(name.as_str()), value.into()));
    }
    let outputs = session.run(values)?;
    std::hint::black_box(outputs.len());
    Ok(())
}

fn main() -> Result<(), Error> {
    let dir = std::env::var_os("TESSERA_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/models")));
    let runs: usize = std::env::var("TESSERA_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(40);
    let runtime = library::load(None)?;
    println!(
        "onnxruntime {} from {}; one thread each; median of {runs}, alternating",
        runtime.version,
        runtime.path.display()
    );
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "model (inputs)", "ort ms", "tessera", "tract", "t/ort", "tract/ort"
    );
    let f32_ = ElemType::FLOAT;
    let models: Vec<(&str, Vec<InputSpec>)> = vec![
        (
            "ch_PP-OCRv4_det_infer.onnx",
            vec![("x", f32_, vec![1, 3, 320, 320])],
        ),
        (
            "ch_PP-OCRv4_rec_infer.onnx",
            vec![("x", f32_, vec![1, 3, 48, 320])],
        ),
        (
            "magika_standard_v3_3.onnx",
            vec![("bytes", ElemType::INT32, vec![1, 2048])],
        ),
        (
            "paraphrase-MiniLM-L3-v2.onnx",
            vec![
                ("input_ids", ElemType::INT64, vec![1, 128]),
                ("attention_mask", ElemType::INT64, vec![1, 128]),
            ],
        ),
    ];
    let mut worst: f64 = 0.0;
    for (name, specs) in models {
        let path = dir.join(name);
        if !path.exists() {
            println!("{name}: missing (run scripts/fetch-test-models.sh)");
            continue;
        }
        let feeds = inputs(&specs, 1)?;
        let map: HashMap<String, Tensor> = feeds.iter().cloned().collect();
        let mut session = Session::builder(&runtime.env)?
            .with_optimization_level(GraphOptimizationLevel::All)?
            .with_intra_threads(1)?
            .with_inter_threads(1)?
            .with_intra_op_spinning(false)?
            .commit_from_file(&path)?;
        let ours = hetero(&path, CpuBackend::OnnxRuntime)?;
        let tract = hetero(&path, CpuBackend::Tract)?;
        // Warm-up (tract specializes its plan to the shapes on first use).
        for _ in 0..2 {
            run_direct(&mut session, &feeds)?;
            ours.run(&map)?;
            tract.run(&map)?;
        }
        let (mut d, mut o, mut t) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let s = Instant::now();
            run_direct(&mut session, &feeds)?;
            d.push(s.elapsed().as_secs_f64() * 1e3);
            let s = Instant::now();
            ours.run(&map)?;
            o.push(s.elapsed().as_secs_f64() * 1e3);
            let s = Instant::now();
            tract.run(&map)?;
            t.push(s.elapsed().as_secs_f64() * 1e3);
        }
        let (d, o, t) = (median(d), median(o), median(t));
        worst = worst.max(o / d);
        let shapes: Vec<String> = specs.iter().map(|(_, _, s)| format!("{s:?}")).collect();
        println!(
            "{:<44} {d:>9.2} {o:>9.2} {t:>9.2} {:>8.3} {:>8.2}",
            format!("{name} {}", shapes.join(" ")),
            o / d,
            t / d
        );
    }
    println!("worst Tessera/onnxruntime median ratio: {worst:.3} (target <= 1.05)");
    Ok(())
}
