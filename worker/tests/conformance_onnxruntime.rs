//! The ONNX node tests through the onnxruntime CPU plugin: zero wrong
//! answers among the tests its QueryNetwork accepts. Of onnx 1.17's 1,288,
//! 29 carry sequences or optionals, which tensors here do not carry; 9
//! train (ai.onnx.preview.training), 9 decode images, 10 draw random
//! numbers and 3 are RoiAlign-22, which onnxruntime 1.32 has no kernel for;
//! 10 are errata. 1,218 pass today (StringNormalizer's with the en_US.UTF-8
//! locale that `scripts/test.sh` generates).

mod util;

use tessera_worker::conformance;

#[test]
fn onnxruntime_plugin_passes_the_onnx_node_tests() {
    let tests =
        conformance::node_tests(&util::node_test_root()).expect("onnx node tests (onnx==1.17.0)");
    assert!(tests.len() > 1000, "found {} node tests", tests.len());
    let plugin = util::cpu_plugin("onnxruntime", "CPU");
    let report = conformance::run(plugin.as_ref(), &tests);
    println!(
        "onnxruntime conformance over {} ONNX node tests: {report}",
        tests.len()
    );
    for (name, why) in &report.unsupported {
        println!("  UNSUPPORTED {name}: {why}");
    }
    for (name, why) in &report.failed {
        println!("  FAILED {name}: {why}");
    }
    for (name, why) in &report.errata {
        println!("  ERRATUM {name}: {why}");
    }
    assert!(
        report.failed.is_empty(),
        "{} accepted tests failed",
        report.failed.len()
    );
    assert!(
        report.passed.len() >= 1210,
        "only {} node tests passed",
        report.passed.len()
    );
}
