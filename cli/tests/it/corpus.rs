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
//! saying so, without one unless TESSERA_GPU_TESTS=required.

use crate::util;

use std::process::Command;

fn corpus(mode: &str, backend: &str) {
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

fn gpu_available() -> bool {
    match tessera_worker::plugins::gpu::GpuPlugin::new() {
        Ok(_) => true,
        Err(e) if std::env::var("TESSERA_GPU_TESTS").as_deref() != Ok("required") => {
            println!("SKIPPED: {e}");
            false
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
    if gpu_available() {
        corpus("local-gpu-cpu", "auto");
    }
}

#[test]
fn corpus_embedded_cluster_gpu_cpu() {
    if gpu_available() {
        corpus("cluster-gpu", "auto");
    }
}
