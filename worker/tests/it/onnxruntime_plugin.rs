//! What is particular to the onnxruntime CPU plugin: QueryNetwork answered
//! per node with onnxruntime's own reasons where the whole model does not
//! build, its compile errors, requests at once on one compiled subgraph,
//! and the models of the corpus accepted whole.

use crate::util;

use tessera_common::onnx::proto::{GraphProto, OperatorSetIdProto};
use tessera_common::onnx::{encode_model, load_model};
use tessera_common::synth::{node, opset17, tensor_info, Rng};
use tessera_common::tensor::Tensor;
use tessera_worker::plugin::{Config, PluginError};

/// `x → Relu → a → Frobnicate (com.example) → b` and `x → Sigmoid → y`:
/// onnxruntime has no kernel for the custom op.
fn model_with_an_unknown_op() -> tessera_common::onnx::proto::ModelProto {
    let mut g = GraphProto {
        name: Some("unknown-op".into()),
        ..Default::default()
    };
    g.input.push(tensor_info("x", 1, &[2, 3]));
    g.node.push(node("relu", "Relu", &["x"], &["a"]));
    let mut frob = node("frob", "Frobnicate", &["a"], &["b"]);
    frob.domain = Some("com.example".into());
    g.node.push(frob);
    g.node.push(node("sigmoid", "Sigmoid", &["x"], &["y"]));
    g.output.push(tensor_info("b", 1, &[2, 3]));
    g.output.push(tensor_info("y", 1, &[2, 3]));
    let mut model = opset17(g);
    model.opset_import.push(OperatorSetIdProto {
        domain: Some("com.example".into()),
        version: Some(1),
    });
    model
}

#[test]
fn query_network_answers_per_node_with_onnxruntimes_reasons() {
    let cpu = util::cpu_plugin("onnxruntime", "CPU");
    let model = model_with_an_unknown_op();
    let answer = cpu.query_network(&model).unwrap();
    let supported: Vec<&str> = answer.supported.iter().map(String::as_str).collect();
    assert_eq!(supported, ["relu", "sigmoid"]);
    let why = &answer.unsupported["frob"];
    assert!(why.contains("Frobnicate"), "{why}");

    // Compiling it anyway names the node onnxruntime refused.
    let err = cpu
        .compile(&encode_model(&model).into(), &Config::default())
        .err()
        .unwrap();
    assert!(matches!(err, PluginError::Compile { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with("onnxruntime cannot compile this subgraph") && text.contains("Frobnicate"),
        "{text}"
    );
}

#[test]
fn real_models_are_accepted_whole() {
    let cpu = util::cpu_plugin("onnxruntime", "CPU");
    for name in [
        "ch_PP-OCRv4_det_infer.onnx",
        "ch_PP-OCRv4_rec_infer.onnx",
        "magika_standard_v3_3.onnx",
        "paraphrase-MiniLM-L3-v2.onnx",
        "silero_vad_16k_op15.onnx",
    ] {
        let model = load_model(util::model_path(name)).expect("run scripts/fetch-test-models.sh");
        let answer = cpu.query_network(&model).unwrap();
        assert!(
            answer.unsupported.is_empty(),
            "{name}: {:?}",
            answer.unsupported
        );
        assert!(!answer.supported.is_empty());
    }
}

#[test]
fn requests_at_once_on_one_subgraph_agree() {
    let cpu = util::cpu_plugin("onnxruntime", "CPU");
    let bytes = std::fs::read(util::model_path("ch_ppocr_mobile_v2.0_cls_infer.onnx")).unwrap();
    let compiled = cpu.compile(&bytes.into(), &Config::default()).unwrap();
    let mut rng = Rng::new(9);
    let values: Vec<f32> = (0..3 * 48 * 192)
        .map(|_| rng.below(1000) as f32 / 500.0 - 1.0)
        .collect();
    let input = Tensor::from_values(vec![1, 3, 48, 192], &values).unwrap();
    let alone = compiled.infer(std::slice::from_ref(&input)).unwrap();
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| compiled.infer(std::slice::from_ref(&input)).unwrap()))
            .collect();
        for r in runs {
            let r = r.join().unwrap();
            assert_eq!(r.outputs, alone.outputs);
        }
    });
}
