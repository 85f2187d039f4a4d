//! The ONNX node tests through the onnxruntime CPU plugin: zero wrong
//! answers among the tests its QueryNetwork accepts, and at least 1,258 of
//! onnx 1.17's 1,288 passed (the 29 that take or give sequences and
//! optionals included, through `infer_values`; the training optimizers,
//! which onnxruntime lacks, and the Resizes it computes differently from
//! the specification, decomposed). Not run: 9 decode images, which
//! onnxruntime 1.32 has no kernel for; 10 draw random numbers (Bernoulli,
//! training-mode Dropout); 11 are errata. StringNormalizer's 4 need the
//! en_US.UTF-8 locale, which `scripts/test.sh` generates.

use crate::util;

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
        report.passed.len() >= 1258,
        "only {} node tests passed (StringNormalizer's need the en_US.UTF-8 locale: \
         scripts/test.sh generates it)",
        report.passed.len()
    );
}
