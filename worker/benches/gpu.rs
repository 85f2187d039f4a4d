//! GPU plugin figures (a figure printer, not a timed test):
//! `cargo bench -p tessera-worker --bench gpu`.
//!
//! MatMul 1024³ GFLOP/s and real-model latencies (PP-OCR cls 48×192 and
//! PP-OCRv4 rec 48×320, one line and a batch of 6; det at 320² and 640²)
//! on the GPU plugin (whatever adapter wgpu finds: lavapipe here) vs the
//! CPU plugin (one thread, and where there are more than two cores, with
//! NUM_THREADS at their number); medians and their ratio. det runs whole on the GPU
//! plugin; cls and rec as HETERO:GPU,CPU (their shape arithmetic stays on
//! the CPU). Also the largest difference between the two sides' outputs,
//! and where the adapter writes timestamps, the GPU time per op type and
//! the slowest nodes (one more run with PERF_COUNT on). Where the adapter
//! has shader-f16: MatMul and cls with float16 tensors vs float32.

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tessera_common::affinity::{DeviceId, DevicePriority};
use tessera_common::onnx::proto::{GraphProto, ModelProto};
use tessera_common::onnx::{encode_model, load_model, tensor_info};
use tessera_common::synth::{node, opset17, to_float16, Rng};
use tessera_common::tensor::Tensor;
use tessera_worker::hetero::{LoadOptions, Network};
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

/// Runs a model or subgraph on one side of the race: its outputs.
type Runner<'a> = Box<dyn Fn() -> Vec<Tensor> + 'a>;

/// Median seconds of `runs` runs of each. Each side warms up (at least
/// 3 runs and 0.5 s) and then runs back to back: a GPU left idle between
/// runs drops its clocks (seen on an H100: det 320² from ~5 to ~15 ms).
fn race(a: &Runner, b: &Runner, runs: usize) -> (f64, f64) {
    let time = |f: &Runner| {
        let warm = Instant::now();
        let mut n = 0;
        while n < 3 || warm.elapsed().as_secs_f64() < 0.5 {
            f();
            n += 1;
        }
        let times = (0..runs)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect();
        median(times)
    };
    (time(a), time(b))
}

/// A compiled subgraph as a runner.
fn plugin_runner<'a>(c: Arc<dyn CompiledSubgraph>, inputs: &'a [Tensor]) -> Runner<'a> {
    Box::new(move || c.infer(inputs).expect("runs").outputs)
}

/// The largest absolute difference between two runs' outputs.
fn max_diff(a: &[Tensor], b: &[Tensor]) -> f32 {
    let mut worst = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (
            x.float_values().expect("float"),
            y.float_values().expect("float"),
        );
        for (u, v) in x.iter().zip(&y) {
            worst = worst.max((u - v).abs());
        }
    }
    worst
}

/// GPU time per op type of one run with PERF_COUNT on (where the adapter
/// writes timestamps): "Conv 61% (1.2 ms), ...", the top five, and the
/// slowest nodes. Whole on the GPU plugin where it runs every node, else
/// the GPU subgraphs of HETERO:GPU,CPU (with each subgraph's wall time).
fn gpu_time_by_op(
    gpu: &GpuPlugin,
    plugins: &[(DeviceId, Arc<dyn DevicePlugin>)],
    model: &ModelProto,
    inputs: &[Tensor],
) -> Option<String> {
    let mut config = Config::default();
    config.set("PERF_COUNT", "YES").expect("a known key");
    let (counters, walls) = match gpu.compile(&encode_model(model).into(), &config) {
        Ok(compiled) => {
            let warm = Instant::now();
            while warm.elapsed().as_secs_f64() < 0.5 {
                compiled.infer(inputs).ok()?;
            }
            (compiled.infer(inputs).ok()?.counters, String::new())
        }
        Err(_) => {
            let options = LoadOptions {
                config,
                ..LoadOptions::by_priority(DevicePriority::parse("HETERO:GPU,CPU").ok()?)
            };
            let network = Network::load(model.clone(), plugins, &options).ok()?;
            let name = model.graph.as_ref()?.input.first()?.name().to_string();
            let named: HashMap<String, Tensor> = [(name, inputs[0].clone())].into();
            let warm = Instant::now();
            while warm.elapsed().as_secs_f64() < 0.5 {
                network.run(&named).ok()?;
            }
            let result = network.run(&named).ok()?;
            let walls: Vec<String> = result
                .subgraphs
                .iter()
                .map(|(d, t, _)| format!("{d} {:.2}", t.as_secs_f64() * 1e3))
                .collect();
            let counters = result
                .subgraphs
                .into_iter()
                .filter(|(d, _, _)| d.starts_with("GPU"))
                .flat_map(|(_, _, c)| c)
                .collect();
            (
                counters,
                format!("; subgraph wall ms: {}", walls.join(", ")),
            )
        }
    };
    if !counters.iter().any(|c| c.exec_type.contains("timestamps")) {
        return None;
    }
    let mut by_op: BTreeMap<&str, u64> = BTreeMap::new();
    for c in &counters {
        *by_op.entry(&c.op_type).or_default() += c.real_us;
    }
    let total: u64 = by_op.values().sum::<u64>().max(1);
    let mut ranked: Vec<(&str, u64)> = by_op.into_iter().collect();
    ranked.sort_by_key(|(_, us)| std::cmp::Reverse(*us));
    let top: Vec<String> = ranked
        .iter()
        .take(5)
        .map(|(op, us)| {
            format!(
                "{op} {:.0}% ({:.2} ms)",
                100.0 * *us as f64 / total as f64,
                *us as f64 / 1e3
            )
        })
        .collect();
    let mut nodes: Vec<_> = counters.iter().collect();
    nodes.sort_by_key(|c| std::cmp::Reverse(c.real_us));
    let slowest: Vec<String> = nodes
        .iter()
        .take(5)
        .map(|c| format!("{} ({}) {} µs", c.node, c.op_type, c.real_us))
        .collect();
    Some(format!(
        "GPU time {:.2} ms in {} nodes: {}; slowest nodes: {}{walls}",
        total as f64 / 1e3,
        counters.len(),
        top.join(", "),
        slowest.join(", ")
    ))
}

/// `t` (float) as float16.
fn to_half(t: &Tensor) -> Tensor {
    let v: Vec<half::f16> = t
        .float_values()
        .expect("float")
        .into_iter()
        .map(half::f16::from_f32)
        .collect();
    Tensor::from_values(t.shape().to_vec(), &v).expect("sizes match")
}

/// `model` on the GPU: whole on the GPU plugin where it runs every node
/// (det), else HETERO:GPU,CPU (cls and rec keep their shape arithmetic on
/// the CPU); with how it was placed.
fn on_gpu<'a>(
    gpu: &GpuPlugin,
    plugins: &[(DeviceId, Arc<dyn DevicePlugin>)],
    model: &ModelProto,
    inputs: &'a [Tensor],
) -> Result<(Runner<'a>, String), String> {
    let config = Config::default();
    if let Ok(c) = gpu.compile(&encode_model(model).into(), &config) {
        return Ok((plugin_runner(c, inputs), "GPU".into()));
    }
    let options = LoadOptions {
        config,
        ..LoadOptions::by_priority(
            DevicePriority::parse("HETERO:GPU,CPU").map_err(|e| e.to_string())?,
        )
    };
    let network = Network::load(model.clone(), plugins, &options).map_err(|e| e.to_string())?;
    let part = network.partition();
    let on = |d: &str| -> usize {
        part.subgraphs
            .iter()
            .filter(|sg| part.device_of(sg).to_string() == d)
            .map(|sg| sg.nodes.len())
            .sum()
    };
    let how = format!(
        "HETERO:GPU,CPU ({} nodes on GPU, {} on CPU)",
        on("GPU"),
        on("CPU")
    );
    let input_name = model
        .graph
        .as_ref()
        .and_then(|g| g.input.first())
        .map(|i| i.name().to_string())
        .unwrap_or_default();
    let named: HashMap<String, Tensor> = [(input_name, inputs[0].clone())].into();
    let runner: Runner = Box::new(move || {
        network
            .run(&named)
            .expect("runs")
            .outputs
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    });
    Ok((runner, how))
}

fn main() {
    let gpu = match GpuPlugin::new() {
        Ok(g) => Arc::new(g),
        Err(e) => {
            println!("no GPU: {e}");
            return;
        }
    };
    let cpu = Arc::new(CpuPlugin::new().expect("the CPU plugin"));
    let caps = gpu
        .metric("OPTIMIZATION_CAPABILITIES")
        .expect("capabilities")
        .to_string();
    println!(
        "GPU: {} ({caps})",
        gpu.metric("FULL_DEVICE_NAME").expect("a name")
    );
    println!("CPU: {}", cpu.metric("FULL_DEVICE_NAME").expect("a name"));
    let half = caps.contains("FP16");
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
    let matmul = opset17(g);
    let onnx = bytes::Bytes::from(encode_model(&matmul));
    let on_gpu_f32 = gpu.compile(&onnx, &config).expect("compiles");
    let on_cpu = cpu.compile(&onnx, &config).expect("compiles");
    let inputs = [random(&[1024, 1024], 1), random(&[1024, 1024], 2)];
    let (tg, tc) = race(
        &plugin_runner(on_gpu_f32.clone(), &inputs),
        &plugin_runner(on_cpu, &inputs),
        3,
    );
    let flops = 2.0 * (n * n * n) as f64;
    println!(
        "MatMul 1024³: GPU {:.1} GFLOP/s, CPU {:.1} GFLOP/s (GPU/CPU speed {:.2})",
        flops / tg / 1e9,
        flops / tc / 1e9,
        tc / tg
    );
    if half {
        let on_gpu_f16 = gpu
            .compile(&encode_model(&to_float16(&matmul)).into(), &config)
            .expect("compiles");
        let halves = [to_half(&inputs[0]), to_half(&inputs[1])];
        let (th, tf) = race(
            &plugin_runner(on_gpu_f16, &halves),
            &plugin_runner(on_gpu_f32, &inputs),
            3,
        );
        println!(
            "MatMul 1024³ with f16 tensors: GPU {:.1} GFLOP/s vs {:.1} with f32 (f16/f32 speed {:.2})",
            flops / th / 1e9,
            flops / tf / 1e9,
            tf / th
        );
    }

    let dir = std::env::var_os("TESSERA_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/models")));
    let plugins: Vec<(DeviceId, Arc<dyn DevicePlugin>)> = vec![
        (DeviceId::parse("GPU").expect("a device"), gpu.clone()),
        (DeviceId::parse("CPU").expect("a device"), cpu.clone()),
    ];
    for (name, shape, runs) in [
        (
            "ch_ppocr_mobile_v2.0_cls_infer.onnx",
            [1usize, 3, 48, 192],
            9,
        ),
        // rapidocr runs cls and rec on batches of 6 text lines.
        ("ch_ppocr_mobile_v2.0_cls_infer.onnx", [6, 3, 48, 192], 9),
        ("ch_PP-OCRv4_rec_infer.onnx", [1, 3, 48, 320], 9),
        ("ch_PP-OCRv4_rec_infer.onnx", [6, 3, 48, 320], 5),
        ("ch_PP-OCRv4_det_infer.onnx", [1, 3, 320, 320], 5),
        ("ch_PP-OCRv4_det_infer.onnx", [1, 3, 640, 640], 3),
    ] {
        let Ok(model) = load_model(dir.join(name)) else {
            println!("{name}: missing (scripts/fetch-test-models.sh)");
            continue;
        };
        let onnx = bytes::Bytes::from(encode_model(&model));
        let inputs = vec![random(&shape, 3)];
        let on_cpu = plugin_runner(cpu.compile(&onnx, &config).expect("compiles"), &inputs);
        let (on_gpu_f32, how) = match on_gpu(&gpu, &plugins, &model, &inputs) {
            Ok(r) => r,
            Err(e) => {
                println!("{name}: {e}");
                continue;
            }
        };
        let diff = max_diff(&on_gpu_f32(), &on_cpu());
        let (tg, tc) = race(&on_gpu_f32, &on_cpu, runs);
        println!(
            "{name} {shape:?}: {how} {:.2} ms, CPU {:.2} ms (GPU/CPU speed {:.2}); outputs differ by at most {:.1e}",
            tg * 1e3,
            tc * 1e3,
            tc / tg,
            diff
        );
        // The CPU plugin on every core too (NUM_THREADS: tract runs its
        // matmuls on a pool; the rest of the model stays on one thread).
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores > 2 {
            let mut threaded = Config::default();
            threaded
                .set("NUM_THREADS", &cores.to_string())
                .expect("a known key");
            let on_cores = plugin_runner(cpu.compile(&onnx, &threaded).expect("compiles"), &inputs);
            let (tg, tm) = race(&on_gpu_f32, &on_cores, runs);
            println!(
                "  CPU plugin with NUM_THREADS={cores}: {:.2} ms (GPU/CPU speed {:.2})",
                tm * 1e3,
                tm / tg
            );
        }
        if let Some(profile) = gpu_time_by_op(&gpu, &plugins, &model, &inputs) {
            println!("  {profile}");
        }
        // cls in float16 (det and magika hold weights beyond f16's range).
        if half && name.contains("cls") {
            let halves = vec![to_half(&inputs[0])];
            let placed = on_gpu(&gpu, &plugins, &to_float16(&model), &halves);
            match placed {
                Ok((on_gpu_f16, how)) => {
                    let diff = max_diff(&on_gpu_f16(), &on_gpu_f32());
                    let (th, tf) = race(&on_gpu_f16, &on_gpu_f32, runs);
                    println!(
                        "  in f16: {how} {:.2} ms vs {:.2} ms in f32 (f16/f32 speed {:.2}); outputs differ by at most {:.1e}",
                        th * 1e3,
                        tf * 1e3,
                        tf / th,
                        diff
                    );
                }
                Err(e) => println!("  in f16: {e}"),
            };
        }
    }
}
