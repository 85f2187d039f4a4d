//! HETERO overhead (a figure printer, not a timed test):
//! `cargo bench -p tessera-worker --bench overhead`.
//!
//! The same model and input through Tessera's HETERO path on the CPU plugin
//! alone vs tract called directly; prints median latencies and their ratio
//! (target ≤ 1.05). Runs alternate between the two so that noise on a
//! shared machine hits both alike.

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tessera_common::affinity::{DeviceId, DevicePriority, Policy};
use tessera_common::partition::Algorithm;
use tessera_common::synth::Rng;
use tessera_common::tensor::Tensor;
use tessera_worker::hetero::{LoadOptions, Network};
use tessera_worker::plugin::{Config, DevicePlugin};
use tessera_worker::plugins::cpu::CpuPlugin;
use tract_onnx::prelude::*;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> TractResult<()> {
    let dir = std::env::var_os("TESSERA_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/models")));
    let runs = 30;
    println!(
        "{:<40} {:>12} {:>12} {:>8}",
        "model (input)", "tract ms", "tessera ms", "ratio"
    );
    for (name, input, shape) in [
        (
            "ch_ppocr_mobile_v2.0_cls_infer.onnx",
            "x",
            vec![1usize, 3, 48, 192],
        ),
        ("ch_PP-OCRv4_rec_infer.onnx", "x", vec![1, 3, 48, 320]),
        ("ch_PP-OCRv4_det_infer.onnx", "x", vec![1, 3, 320, 320]),
    ] {
        let path = dir.join(name);
        let mut rng = Rng::new(1);
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n)
            .map(|_| rng.below(2000) as f32 / 1000.0 - 1.0)
            .collect();

        // tract directly, as its README does it.
        let plan = tract_onnx::onnx()
            .with_ignore_value_info(true)
            .model_for_path(&path)?
            .with_input_fact(0, f32::fact(&shape).into())?
            .into_optimized()?
            .into_runnable()?;
        let x: TValue = tract_onnx::prelude::Tensor::from_shape(&shape, &values)?.into();
        plan.run(tvec![x.clone()])?;

        // Tessera: HETERO:CPU.
        let cpu: Arc<dyn DevicePlugin> = Arc::new(CpuPlugin::new().expect("cpu"));
        let options = LoadOptions {
            priority: DevicePriority::parse("HETERO:CPU").expect("priority"),
            policy: Policy::Priority,
            algorithm: Algorithm::Fast,
            strict: true,
            manual: Default::default(),
            config: Config::default(),
            shapes: Default::default(),
        };
        let model = tessera_common::onnx::load_model(&path).expect("model");
        let network = Network::load(
            model,
            &[(DeviceId::parse("CPU").expect("id"), cpu)],
            &options,
        )
        .expect("load");
        let inputs: HashMap<String, Tensor> = HashMap::from([(
            input.to_string(),
            Tensor::from_values(shape.clone(), &values).expect("tensor"),
        )]);
        network.run(&inputs).expect("run");
        // Alternate the two so that machine noise hits both alike.
        let (mut direct, mut hetero) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let t = Instant::now();
            plan.run(tvec![x.clone()])?;
            direct.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            network.run(&inputs).expect("run");
            hetero.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (direct, hetero) = (median(direct), median(hetero));
        println!(
            "{:<40} {direct:>12.2} {hetero:>12.2} {:>8.3}",
            format!("{name} {shape:?}"),
            hetero / direct
        );
    }
    Ok(())
}
