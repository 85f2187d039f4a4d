//! The ONNX node tests through the CPU plugin: zero wrong answers among the
//! tests its QueryNetwork accepts.

use crate::util;

use tessera_worker::conformance;
use tessera_worker::plugins::cpu::CpuPlugin;

#[test]
fn cpu_plugin_passes_the_onnx_node_tests_it_accepts() {
    let tests =
        conformance::node_tests(&util::node_test_root()).expect("onnx node tests (onnx==1.17.0)");
    assert!(tests.len() > 1000, "found {} node tests", tests.len());
    let plugin = CpuPlugin::new().unwrap();
    let report = conformance::run(&plugin, &tests);
    println!(
        "CPU conformance over {} ONNX node tests: {report}",
        tests.len()
    );
    let mut reasons: std::collections::BTreeMap<String, usize> = Default::default();
    for (_, why) in &report.unsupported {
        let key: String = why
            .split(['(', ':'])
            .next()
            .unwrap_or("")
            .chars()
            .take(60)
            .collect();
        *reasons.entry(key).or_default() += 1;
    }
    let mut top: Vec<_> = reasons.into_iter().collect();
    top.sort_by_key(|e| std::cmp::Reverse(e.1));
    for (why, n) in top.iter().take(8) {
        println!("  unsupported x{n}: {why}");
    }
    // TESSERA_CONFORMANCE_LIST=1 lists every unsupported test and its reason.
    if std::env::var_os("TESSERA_CONFORMANCE_LIST").is_some() {
        for (name, why) in &report.unsupported {
            println!("  UNSUPPORTED {name}: {why}");
        }
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
    // The plugin issue's target (onnx 1.17 ships 1,288 node tests).
    assert!(
        report.passed.len() >= 1106,
        "only {} node tests passed",
        report.passed.len()
    );
}
