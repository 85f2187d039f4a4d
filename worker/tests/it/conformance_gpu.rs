//! The ONNX node tests through the GPU plugin (wgpu; lavapipe in CI): zero
//! wrong answers among the tests its QueryNetwork accepts, and every op of
//! the plugin's list exercised by at least one passing test.
//!
//! Without a GPU adapter the test says so and passes, unless
//! `TESSERA_GPU_TESTS=required` (`scripts/test.sh` sets it after installing
//! lavapipe).

use crate::util;

use std::collections::BTreeSet;

use tessera_worker::conformance;
use tessera_worker::plugin::DevicePlugin;

#[test]
fn gpu_plugin_passes_the_onnx_node_tests_it_accepts() {
    let Some(plugin) = util::gpu_plugin() else {
        return;
    };
    println!(
        "GPU: {:?}; {:?}",
        plugin.metric("FULL_DEVICE_NAME").unwrap().to_string(),
        plugin
            .metric("OPTIMIZATION_CAPABILITIES")
            .unwrap()
            .to_string()
    );
    let tests =
        conformance::node_tests(&util::node_test_root()).expect("onnx node tests (onnx==1.17.0)");
    let report = conformance::run(&plugin, &tests);
    println!(
        "GPU conformance over {} ONNX node tests: {report}",
        tests.len()
    );
    for (name, why) in &report.failed {
        println!("  FAILED {name}: {why}");
    }
    if std::env::var_os("TESSERA_CONFORMANCE_LIST").is_some() {
        for (name, why) in &report.unsupported {
            println!("  UNSUPPORTED {name}: {why}");
        }
        for name in &report.passed {
            println!("  PASSED {name}");
        }
    }
    assert!(
        report.failed.is_empty(),
        "{} accepted tests failed",
        report.failed.len()
    );
    // Every op of the plugin's list passes at least one node test (the
    // node tests are named test_<op in snake case>...).
    let snake = |op: &str| {
        let mut s = String::new();
        for (i, c) in op.chars().enumerate() {
            if c.is_uppercase() && i > 0 {
                s.push('_');
            }
            s.push(c.to_ascii_lowercase());
        }
        s
    };
    let passed: BTreeSet<&str> = report.passed.iter().map(String::as_str).collect();
    // Cast converts between f32 and f16: only with shader-f16.
    let half = plugin
        .metric("OPTIMIZATION_CAPABILITIES")
        .unwrap()
        .to_string()
        .contains("FP16");
    let missing: Vec<&str> = tessera_worker::plugins::gpu::ops::OPS
        .iter()
        .map(|(op, _)| *op)
        .filter(|op| half || *op != "Cast")
        .filter(|op| {
            let mut names = vec![snake(op), op.to_ascii_lowercase()];
            if *op == "BatchNormalization" {
                names.push("batchnorm".into());
            }
            !passed
                .iter()
                .any(|t| names.iter().any(|n| t.starts_with(&format!("test_{n}"))))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ops without a passing node test: {missing:?}"
    );
}
