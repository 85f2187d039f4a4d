//! `tessera partition` end to end: a real model, supports files, dumps in
//! the stable JSON form, exported subgraphs, and clear errors.

use crate::util;

use std::path::PathBuf;

use util::{model, tessera};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn partitions_a_real_model_with_dumps() {
    let model = model("ch_PP-OCRv4_det_infer.onnx");
    assert!(model.exists(), "run scripts/fetch-test-models.sh");
    let dir = temp_dir("dump");
    let supports = dir.join("gpu.txt");
    std::fs::write(
        &supports,
        "# what the GPU runs\nop:Conv\nop:Relu\nop:Add\nop:Mul\n",
    )
    .unwrap();
    let (ok, stdout, stderr) = tessera(&[
        "partition",
        model.to_str().unwrap(),
        "--devices",
        "HETERO:GPU,CPU",
        "--supports",
        &format!("GPU={}", supports.display()),
        "--dump-dir",
        dir.to_str().unwrap(),
        "--export-dir",
        dir.join("sub").to_str().unwrap(),
    ]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("by priority"), "explanations are printed");
    for file in ["_affinity.dot", "_subgraphs.dot", "_subgraphs.json"] {
        let path = dir.join(format!("ch_PP-OCRv4_det_infer{file}"));
        assert!(path.exists(), "{}", path.display());
    }
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("ch_PP-OCRv4_det_infer_subgraphs.json")).unwrap(),
    )
    .unwrap();
    let subgraphs = json["subgraphs"].as_array().unwrap();
    assert!(subgraphs.len() >= 2);
    let mut seen = 0;
    for (i, sg) in subgraphs.iter().enumerate() {
        assert_eq!(sg["id"].as_u64(), Some(i as u64));
        assert!(["GPU", "CPU"].contains(&sg["device"].as_str().unwrap()));
        assert!(sg["inputs"].is_array() && sg["outputs"].is_array());
        seen += sg["nodes"].as_array().unwrap().len();
        assert!(dir.join("sub").join(format!("subgraph_{i}.onnx")).exists());
    }
    let affinity = json["affinity"].as_object().unwrap();
    assert_eq!(
        affinity.len(),
        seen,
        "every real node is in the affinity map and in one subgraph"
    );
    assert!(affinity.values().any(|d| d == "GPU") && affinity.values().any(|d| d == "CPU"));
    let dot = std::fs::read_to_string(dir.join("ch_PP-OCRv4_det_infer_subgraphs.dot")).unwrap();
    assert!(dot.contains("subgraph cluster_0") && dot.contains("@ local"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_gives_clear_errors() {
    let model = model("ch_ppocr_mobile_v2.0_cls_infer.onnx");
    let m = model.to_str().unwrap();
    let dir = temp_dir("errors");
    let garbage = dir.join("garbage.onnx");
    std::fs::write(&garbage, b"definitely not onnx").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![m.into(), "--devices".into(), "HETERO:GPU,,CPU".into()],
            "position 11",
        ),
        (
            vec![
                m.into(),
                "--devices".into(),
                "HETERO:GPU,CPU".into(),
                "--supports".into(),
                "NPU=x".into(),
            ],
            "not in --devices",
        ),
        (
            vec![
                m.into(),
                "--devices".into(),
                "GPU,CPU".into(),
                "--supports".into(),
                "GPU=/nonexistent".into(),
            ],
            "cannot read supports file",
        ),
        (
            vec![
                garbage.to_str().unwrap().into(),
                "--devices".into(),
                "CPU".into(),
            ],
            "not a valid ONNX model",
        ),
        (
            vec![
                m.into(),
                "--devices".into(),
                "GPU,CPU".into(),
                "--strict".into(),
                "--supports".into(),
                format!("GPU={}", dir.join("empty.txt").display()),
                "--supports".into(),
                format!("CPU={}", dir.join("empty.txt").display()),
            ],
            "strict mode",
        ),
    ];
    std::fs::write(dir.join("empty.txt"), "").unwrap();
    for (args, expect) in cases {
        let mut full = vec!["partition".to_string()];
        full.extend(args);
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        let (ok, stdout, stderr) = tessera(&refs);
        assert!(!ok, "{full:?} should fail\n{stdout}");
        assert!(
            stderr.contains(expect),
            "{full:?}: expected '{expect}' in:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
