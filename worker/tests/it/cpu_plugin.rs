//! The CPU plugin's API on each backend (tract, onnxruntime): metrics,
//! configuration, a real model against onnxruntime, bad inputs,
//! export/import and performance counters.

use crate::util;

use tessera_common::synth::Rng;
use tessera_common::tensor::Tensor;
use tessera_worker::plugin::{Config, ExecStatus, MetricValue, PluginError, METRICS};
use tessera_worker::plugins;

const BACKENDS: [&str; 2] = ["tract", "onnxruntime"];

#[test]
fn metrics_and_config_are_validated() {
    for backend in BACKENDS {
        metrics_and_config_on(backend);
    }
    let err = plugins::create("TPU").err().unwrap();
    assert!(err.to_string().contains("known: CPU"), "{err}");
}

fn metrics_and_config_on(backend: &str) {
    let cpu = util::cpu_plugin(backend, "CPU");
    let full_name = cpu.metric("FULL_DEVICE_NAME").unwrap().to_string();
    let label = if backend == "tract" {
        "tract-onnx 0.23"
    } else {
        "onnxruntime 1.32.0"
    };
    assert!(full_name.contains(label), "{full_name}");
    assert_eq!(cpu.name(), "CPU");
    assert_eq!(cpu.available_devices(), ["CPU.0"]);
    for m in METRICS {
        cpu.metric(m).unwrap_or_else(|e| panic!("{m}: {e}"));
    }
    let MetricValue::Number(gflops) = cpu.metric("GFLOPS").unwrap() else {
        panic!()
    };
    assert!(gflops > 0.1, "calibrated {gflops} GFLOP/s");
    let err = cpu.metric("FLUX_CAPACITY").unwrap_err();
    assert!(
        matches!(err, PluginError::UnknownMetric { .. })
            && err.to_string().contains("FULL_DEVICE_NAME"),
        "{err}"
    );
    cpu.set_config("NUM_THREADS", "2").unwrap();
    assert_eq!(cpu.config().num_threads(), Some(2));
    let err = cpu.set_config("NUM_THREADZ", "2").unwrap_err();
    assert!(
        err.to_string().contains("'NUM_THREADZ'") && err.to_string().contains("PERFORMANCE_HINT"),
        "{err}"
    );
    let err = cpu.set_config("PERFORMANCE_HINT", "fast").unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad value 'fast' for config key PERFORMANCE_HINT; allowed: LATENCY or THROUGHPUT"
    );
    assert!(cpu.set_config("NUM_REQUESTS", "0").is_err());
    let err = cpu.set_config("NUM_THREADS", "0").unwrap_err();
    assert!(err.to_string().contains(">= 1"), "{err}");
}

#[test]
fn runs_a_real_model_like_onnxruntime_and_rejects_bad_inputs() {
    for backend in BACKENDS {
        runs_a_real_model_on(backend);
    }
}

fn runs_a_real_model_on(backend: &str) {
    let path = util::model_path("ch_ppocr_mobile_v2.0_cls_infer.onnx");
    let cpu = util::cpu_plugin(backend, "CPU");
    let model = tessera_common::onnx::load_model(&path).unwrap();
    let query = cpu.query_network(&model).unwrap();
    assert!(query.unsupported.is_empty(), "{:?}", query.unsupported);
    let mut config = Config::default();
    config.set("PERF_COUNT", "YES").unwrap();
    let compiled = cpu
        .compile(&std::fs::read(&path).unwrap().into(), &config)
        .unwrap();
    let spec = &compiled.inputs()[0];
    let shape = vec![1, 3, 48, 192];
    let mut rng = Rng::new(3);
    let values: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| rng.below(1000) as f32 / 500.0 - 1.0)
        .collect();
    let input = Tensor::from_values(shape.clone(), &values).unwrap();
    let result = compiled.infer(std::slice::from_ref(&input)).unwrap();

    // onnxruntime on the same input.
    let dir = std::env::temp_dir().join(format!("tessera-cpu-{backend}-{}", std::process::id()));
    let want = util::onnxruntime(&path, &[(spec.name.clone(), input.clone())], &dir);
    let diff = util::max_abs_diff(&result.outputs[0], &want[0]);
    println!("cls on the {backend} CPU plugin vs onnxruntime (Python): max abs diff {diff:e}");
    assert!(diff <= 1e-4, "{diff}");
    let _ = std::fs::remove_dir_all(&dir);

    // Performance counters per original node.
    assert!(
        result
            .counters
            .iter()
            .any(|c| c.status == ExecStatus::Executed && c.op_type == "Conv"),
        "{backend}: {:?}",
        result.counters
    );
    assert!(result.counters.iter().all(|c| !c.to_string().is_empty()));

    // Bad inputs: count, type, shape.
    let err = compiled.infer(&[]).err().unwrap();
    assert!(err.to_string().contains("expected 1 inputs (x)"), "{err}");
    let ints = Tensor::from_values(shape.clone(), &vec![0i64; values.len()]).unwrap();
    let err = compiled.infer(&[ints]).err().unwrap();
    assert!(
        err.to_string().contains("must be float, got int64"),
        "{err}"
    );
    let rank3 = Tensor::from_values(vec![3, 48, 192], &vec![0f32; 3 * 48 * 192]).unwrap();
    let err = compiled.infer(&[rank3]).err().unwrap();
    assert!(
        err.to_string().contains("input 'x' must have shape [?,3,"),
        "{err}"
    );
    let channels = Tensor::from_values(vec![1, 4, 48, 192], &vec![0f32; 4 * 48 * 192]).unwrap();
    assert!(compiled.infer(&[channels]).is_err());
}

#[test]
fn export_import_round_trip_and_mismatches() {
    for backend in BACKENDS {
        export_import_on(backend);
    }
}

fn export_import_on(backend: &str) {
    let cpu = util::cpu_plugin(backend, "CPU");
    let bytes = std::fs::read(util::model_path("ch_ppocr_mobile_v2.0_cls_infer.onnx")).unwrap();
    let mut config = Config::default();
    config.set("NUM_THREADS", "1").unwrap();
    let bytes = bytes::Bytes::from(bytes);
    let compiled = cpu.compile(&bytes, &config).unwrap();
    let blob = tessera_worker::plugin::blob::join(&compiled.export().unwrap());
    let imported = cpu.import(&blob).unwrap();
    assert_eq!(imported.inputs(), compiled.inputs());
    let other = util::cpu_plugin(backend, "CPU_B");
    let err = other.import(&blob).err().unwrap();
    assert!(err.to_string().contains("made by CPU on "), "{err}");
    let other_backend = if backend == "tract" {
        "onnxruntime"
    } else {
        "tract"
    };
    let err = util::cpu_plugin(other_backend, "CPU")
        .import(&blob)
        .err()
        .unwrap();
    assert!(err.to_string().contains("made by CPU on "), "{err}");
    assert!(cpu.import(&bytes::Bytes::from_static(b"garbage")).is_err());
    assert!(cpu.import(&blob.slice(..20)).is_err());
    assert!(cpu
        .compile(&bytes::Bytes::from_static(b"not onnx"), &Config::default())
        .is_err());
}
