//! GPU plugin figures (a figure printer, not a timed test):
//! `cargo bench -p tessera-worker --bench gpu`.
//!
//! MatMul 1024³ GFLOP/s and real-model latencies (PP-OCR cls, PP-OCRv4 det
//! 320×320 and rec 48×320), each on the GPU plugin (whatever adapter wgpu
//! finds: lavapipe here) vs the CPU plugin, runs alternating between the
//! two; medians and their ratio.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tessera_common::onnx::proto::GraphProto;
use tessera_common::onnx::{encode_model, load_model, tensor_info};
use tessera_common::synth::{node, opset17, Rng};
use tessera_common::tensor::Tensor;
use tessera_worker::plugin::{CompiledSubgraph, Config, DevicePlugin};
use tessera_worker::plugins::cpu::CpuPlugin;
use tessera_worker::plugins::gpu::GpuPlugin;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn random(shape: &[usize], seed: u64) -> Tensor {
    let mut rng = Rng::new(seed);
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n)
        .map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
        .collect();
    Tensor::from_values(shape.to_vec(), &values).expect("sizes match")
}

/// Median seconds of `runs` alternating runs on each, after a warm-up.
fn race(
    a: &Arc<dyn CompiledSubgraph>,
    b: &Arc<dyn CompiledSubgraph>,
    inputs: &[Tensor],
    runs: usize,
) -> (f64, f64) {
    a.infer(inputs).expect("runs");
    b.infer(inputs).expect("runs");
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        a.infer(inputs).expect("runs");
        ta.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        b.infer(inputs).expect("runs");
        tb.push(t.elapsed().as_secs_f64());
    }
    (median(ta), median(tb))
}

fn main() {
    let gpu = match GpuPlugin::new() {
        Ok(g) => g,
        Err(e) => {
            println!("no GPU: {e}");
            return;
        }
    };
    let cpu = CpuPlugin::new().expect("the CPU plugin");
    println!("GPU: {}", gpu.metric("FULL_DEVICE_NAME").expect("a name"));
    println!("CPU: {}", cpu.metric("FULL_DEVICE_NAME").expect("a name"));
    let config = Config::default();

    let n = 1024usize;
    let d = n as i64;
    let g = GraphProto {
        name: Some("matmul".into()),
        node: vec![node("mm", "MatMul", &["a", "b"], &["y"])],
        input: vec![tensor_info("a", 1, &[d, d]), tensor_info("b", 1, &[d, d])],
        output: vec![tensor_info("y", 1, &[d, d])],
        ..Default::default()
    };
    let onnx = encode_model(&opset17(g));
    let on_gpu = gpu.compile(&onnx, &config).expect("compiles");
    let on_cpu = cpu.compile(&onnx, &config).expect("compiles");
    let inputs = [random(&[1024, 1024], 1), random(&[1024, 1024], 2)];
    let (tg, tc) = race(&on_gpu, &on_cpu, &inputs, 3);
    let flops = 2.0 * (n * n * n) as f64;
    println!(
        "MatMul 1024³: GPU {:.1} GFLOP/s, CPU {:.1} GFLOP/s (GPU/CPU speed {:.2})",
        flops / tg / 1e9,
        flops / tc / 1e9,
        tc / tg
    );

    let dir = std::env::var_os("TESSERA_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/models")));
    for (name, shape, runs) in [
        (
            "ch_ppocr_mobile_v2.0_cls_infer.onnx",
            [1usize, 3, 48, 192],
            5,
        ),
        ("ch_PP-OCRv4_rec_infer.onnx", [1, 3, 48, 320], 5),
        ("ch_PP-OCRv4_det_infer.onnx", [1, 3, 320, 320], 3),
    ] {
        let Ok(model) = load_model(dir.join(name)) else {
            println!("{name}: missing (scripts/fetch-test-models.sh)");
            continue;
        };
        let onnx = encode_model(&model);
        // The whole model on each device where it can (the GPU plugin runs
        // every node of det and cls; rec needs HETERO, measured by the
        // conformance of its parts instead).
        let on_gpu = match gpu.compile(&onnx, &config) {
            Ok(c) => c,
            Err(e) => {
                println!("{name}: not entirely on the GPU ({e})");
                continue;
            }
        };
        let on_cpu = cpu.compile(&onnx, &config).expect("compiles");
        let inputs = [random(&shape, 3)];
        match on_gpu.infer(&inputs) {
            Ok(_) => {
                let (tg, tc) = race(&on_gpu, &on_cpu, &inputs, runs);
                println!(
                    "{name} {shape:?}: GPU {:.1} ms, CPU {:.1} ms (GPU/CPU speed {:.2})",
                    tg * 1e3,
                    tc * 1e3,
                    tc / tg
                );
            }
            Err(e) => println!("{name}: not entirely on the GPU ({e})"),
        }
    }
}
