//! `tessera run --local`: .npy in, .npy out, same numbers as onnxruntime;
//! bad inputs are clear errors.

use crate::util;

use std::path::PathBuf;
use std::process::Command;

use util::{model, tessera};

use tessera_common::synth::Rng;
use tessera_common::tensor::{read_npy, write_npy, Tensor};

#[test]
fn run_matches_onnxruntime_through_npy_files() {
    let dir = std::env::temp_dir().join(format!("tessera-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = model("ch_ppocr_mobile_v2.0_cls_infer.onnx");
    let mut rng = Rng::new(9);
    let x: Vec<f32> = (0..3 * 48 * 192)
        .map(|_| rng.below(2000) as f32 / 1000.0 - 1.0)
        .collect();
    let input = dir.join("x.npy");
    std::fs::write(
        &input,
        write_npy(&Tensor::from_values(vec![1, 3, 48, 192], &x).unwrap()).unwrap(),
    )
    .unwrap();
    let out_dir = dir.join("out");
    let (ok, stdout, stderr) = tessera(&[
        "run",
        m.to_str().unwrap(),
        "--devices",
        "HETERO:CPU",
        "--local",
        "--input",
        &format!("x={}", input.display()),
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--perf-counts",
    ]);
    assert!(ok, "{stdout}{stderr}");
    assert!(
        stdout.contains("Total time:") && stdout.contains("EXECUTED"),
        "{stdout}"
    );
    let files: Vec<PathBuf> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let got = read_npy(&std::fs::read(&files[0]).unwrap())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/python/ort_run.py"
        ))
        .args([
            m.to_str().unwrap(),
            dir.join("ort").to_str().unwrap(),
            &format!("x={}", input.display()),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = read_npy(&std::fs::read(dir.join("ort/out0.npy")).unwrap())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(diff <= 1e-4, "max abs diff {diff}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_rejects_bad_input_clearly() {
    let dir = std::env::temp_dir().join(format!("tessera-run-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = model("ch_ppocr_mobile_v2.0_cls_infer.onnx");
    let m = m.to_str().unwrap();
    let ints = dir.join("ints.npy");
    std::fs::write(
        &ints,
        write_npy(&Tensor::from_values(vec![1, 3, 48, 192], &vec![0i64; 3 * 48 * 192]).unwrap())
            .unwrap(),
    )
    .unwrap();
    let small = dir.join("small.npy");
    std::fs::write(
        &small,
        write_npy(&Tensor::from_values(vec![3, 48, 192], &vec![0f32; 3 * 48 * 192]).unwrap())
            .unwrap(),
    )
    .unwrap();
    let garbage = dir.join("garbage.npy");
    std::fs::write(&garbage, b"nope").unwrap();
    let input = |f: &PathBuf, name: &str| format!("{name}={}", f.display());
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--input".into(), input(&small, "nope")],
            "unknown input 'nope'",
        ),
        (
            vec!["--input".into(), input(&ints, "x")],
            "input 'x' must be float",
        ),
        (
            vec!["--input".into(), input(&small, "x")],
            "input 'x' must have shape",
        ),
        (
            vec!["--input".into(), input(&garbage, "x")],
            "not a valid .npy file",
        ),
        (vec![], "missing input 'x'"),
        (
            vec!["--devices".into(), "HETERO:TPU".into()],
            "unknown device kind",
        ),
        (
            vec!["--devices".into(), "HETERO:node-a/CPU".into()],
            "need a cluster",
        ),
    ];
    for (extra, expect) in cases {
        let mut args = vec!["run".to_string(), m.to_string(), "--local".into()];
        args.extend(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, stdout, stderr) = tessera(&refs);
        assert!(!ok, "{args:?} should fail: {stdout}");
        assert!(
            stderr.contains(expect),
            "{args:?}: expected '{expect}' in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // Without --local the same run goes to an embedded cluster.
    let (ok, stdout, stderr) = tessera(&["run", m, "--random"]);
    assert!(
        ok && stdout.contains("1 subgraphs on node-a"),
        "{stdout}{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without onnxruntime's library the CPU device falls back to tract and
/// says so once; a forced onnxruntime backend is a clear error; an unknown
/// backend name is refused by the flag.
#[test]
fn cpu_backend_falls_back_to_tract_without_onnxruntime() {
    let m = model("ch_ppocr_mobile_v2.0_cls_infer.onnx");
    let m = m.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("tessera-run-fallback-{}", std::process::id()));
    let run = |backend: &str| {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["run", m, "--local", "--random", "--cpu-backend", backend])
            .args(["--output-dir", dir.to_str().unwrap()])
            .env("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so.1.32.0")
            .env("RUST_LOG", "info")
            .output()
            .expect("tessera runs")
    };
    let auto = run("auto");
    let stderr = String::from_utf8_lossy(&auto.stderr);
    assert!(auto.status.success(), "{stderr}");
    assert!(
        stderr.contains("CPU on tract-onnx")
            && stderr.contains("onnxruntime 1.32.0 not found: set ORT_DYLIB_PATH"),
        "{stderr}"
    );
    let forced = run("onnxruntime");
    let stderr = String::from_utf8_lossy(&forced.stderr);
    assert!(!forced.status.success());
    assert!(
        stderr.contains(
            "onnxruntime 1.32.0 not found: set ORT_DYLIB_PATH or install onnxruntime==1.32.0"
        ),
        "{stderr}"
    );
    let (ok, _, stderr) = tessera(&["run", m, "--local", "--random", "--cpu-backend", "fast"]);
    assert!(
        !ok && stderr.contains("unknown CPU backend 'fast'"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A successful run on a GPU device prints nothing on stderr but the
/// plan's summary: no `XDG_RUNTIME_DIR` errors from Mesa's
/// device-selection layer on a machine without a desktop session. Skipped
/// without a GPU adapter (lavapipe in CI) unless TESSERA_GPU_TESTS=required.
#[test]
fn a_gpu_run_prints_no_loader_noise() {
    let m = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/models/small_cnn.onnx");
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["run", m.to_str().unwrap(), "--local", "--random"])
        .args(["--devices", "HETERO:GPU,CPU"])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("NODEVICE_SELECT")
        .env_remove("RUST_LOG")
        .output()
        .expect("tessera runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("no GPU adapter found")
        && std::env::var("TESSERA_GPU_TESTS").as_deref() != Ok("required")
    {
        println!("SKIPPED: no GPU adapter");
        return;
    }
    assert!(out.status.success(), "{stderr}");
    let noise: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("XDG_RUNTIME_DIR") || l.to_ascii_lowercase().starts_with("error"))
        .collect();
    assert!(
        noise.is_empty(),
        "error lines on a successful run: {noise:?}"
    );
}
