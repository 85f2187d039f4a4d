//! The real-model corpus in every mode, through the `tessera` binary and
//! compared with onnxruntime on the same inputs by
//! `tests/python/corpus.py` (PP-OCRv4 det/rec/cls, magika, the nine
//! `light_*` models of onnx 1.17, MiniLM-L3, Silero VAD's LSTM variant):
//! (a) `--local` HETERO:CPU, (b) `--local` HETERO:GPU,CPU, (c) the
//! embedded two-worker cluster with CPU workers, (d) with GPU,CPU workers.
//! The CPU modes run on each CPU backend (tract, onnxruntime); the GPU
//! modes on the default one (onnxruntime where it loads).
//! Tolerance: 1e-4 × max(1, max |onnxruntime|) on CPU, 1e-3 with a GPU.
//! The GPU modes run on any adapter (lavapipe in CI) and are skipped,
//! saying so, without one unless TESSERA_GPU_TESTS=required. On a software
//! adapter they leave out vgg19: lavapipe took 167 s and 191 s for its
//! 20 GFLOP in the two GPU modes on two cores (a third of the corpus's
//! time), and its ops (Conv, Relu, MaxPool, Gemm, Softmax) are alexnet's
//! and zfnet512's, which run.

use crate::util;

use std::process::Command;

/// The models a GPU on a software adapter leaves out, for time alone.
const TOO_SLOW_IN_SOFTWARE: &[&str] = &["light_vgg19.onnx"];

fn corpus(mode: &str, backend: &str) {
    corpus_without(mode, backend, &[]);
}

fn corpus_without(mode: &str, backend: &str, left_out: &[&str]) {
    let models = util::model("magika_standard_v3_3.onnx")
        .parent()
        .expect("models dir")
        .to_path_buf();
    let work = std::env::temp_dir().join(format!(
        "tessera-corpus-{mode}-{backend}-{}",
        std::process::id()
    ));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/python/corpus.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_tessera"))
        .arg(&models)
        .arg(&work)
        .args(["--mode", mode, "--cpu-backend", backend])
        .args(left_out.iter().flat_map(|m| ["--leave-out", m]))
        .output()
        .expect("python3 with onnxruntime (scripts/test.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let _ = std::fs::remove_dir_all(&work);
    assert!(
        out.status.success(),
        "corpus [{mode}, {backend}] failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The models a GPU mode leaves out here, or `None` without a GPU.
fn gpu_leaves_out() -> Option<&'static [&'static str]> {
    use tessera_worker::plugin::{DevicePlugin, MetricValue};
    match tessera_worker::plugins::gpu::GpuPlugin::new() {
        Ok(gpu) => {
            let software = matches!(
                gpu.metric("DEVICE_ARCHITECTURE"),
                Ok(MetricValue::Text(a)) if a.contains(" Cpu ")
            );
            if software {
                println!("a software adapter: leaving out {TOO_SLOW_IN_SOFTWARE:?}");
                return Some(TOO_SLOW_IN_SOFTWARE);
            }
            Some(&[])
        }
        Err(e) if std::env::var("TESSERA_GPU_TESTS").as_deref() != Ok("required") => {
            println!("SKIPPED: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn corpus_local_cpu_tract() {
    corpus("local-cpu", "tract");
}

#[test]
fn corpus_local_cpu_onnxruntime() {
    corpus("local-cpu", "onnxruntime");
}

#[test]
fn corpus_embedded_cluster_cpu_tract() {
    corpus("cluster-cpu", "tract");
}

#[test]
fn corpus_embedded_cluster_cpu_onnxruntime() {
    corpus("cluster-cpu", "onnxruntime");
}

#[test]
fn corpus_local_gpu_cpu() {
    if let Some(left_out) = gpu_leaves_out() {
        corpus_without("local-gpu-cpu", "auto", left_out);
    }
}

#[test]
fn corpus_embedded_cluster_gpu_cpu() {
    if let Some(left_out) = gpu_leaves_out() {
        corpus_without("cluster-gpu", "auto", left_out);
    }
}
