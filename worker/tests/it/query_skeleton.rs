//! QueryNetwork on a cluster is asked about the model's skeleton: its
//! initializers over 4 KiB as typed graph inputs, no weight bytes (a worker
//! is asked about models far bigger than its memory). Every plugin must
//! give the same answer as for the whole model: the same nodes supported,
//! the same types found. Checked on every corpus model, as the coordinator
//! prepares it (simplified), for both CPU backends and the GPU where one is.

use crate::util;

use std::collections::BTreeMap;

use tessera_common::onnx::skeleton::{elided, skeleton};
use tessera_common::onnx::{encode_model, load_model};
use tessera_common::plan::prepare;
use tessera_worker::plugin::DevicePlugin;

const CORPUS: &[&str] = &[
    "ch_PP-OCRv4_det_infer.onnx",
    "ch_PP-OCRv4_rec_infer.onnx",
    "ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "magika_standard_v3_3.onnx",
    "light_bvlc_alexnet.onnx",
    "light_densenet121.onnx",
    "light_inception_v1.onnx",
    "light_resnet50.onnx",
    "light_squeezenet.onnx",
    "paraphrase-MiniLM-L3-v2.onnx",
    "silero_vad_16k_sequence.onnx",
];

fn check(plugin: &dyn DevicePlugin, label: &str) {
    let mut elided_in_all = 0;
    for name in CORPUS {
        let model = load_model(util::model_path(name)).unwrap();
        let (graph, _) = prepare(&model, &BTreeMap::new()).unwrap();
        let whole = graph.model().clone();
        let bones = skeleton(&whole);
        elided_in_all += elided(&bones).len();
        let a = plugin
            .query_network(&whole)
            .unwrap_or_else(|e| panic!("{label} {name}: {e}"));
        let b = plugin
            .query_network(&bones)
            .unwrap_or_else(|e| panic!("{label} {name} (skeleton): {e}"));
        let only_whole: Vec<_> = a.supported.difference(&b.supported).collect();
        let only_bones: Vec<_> = b.supported.difference(&a.supported).collect();
        assert!(
            only_whole.is_empty() && only_bones.is_empty(),
            "{label} {name}: supported only with weights {only_whole:?}, only on the skeleton {only_bones:?} (skeleton refuses: {:?})",
            only_whole
                .iter()
                .filter_map(|n| b.unsupported.get(*n))
                .collect::<Vec<_>>()
        );
        assert_eq!(a.types, b.types, "{label} {name}: types found");
        println!(
            "{label} {name}: {} of {} nodes supported, alike with {} weights left out \
             ({} KiB asked about instead of {} KiB)",
            a.supported.len(),
            a.supported.len() + a.unsupported.len(),
            elided(&bones).len(),
            encode_model(&bones).len() >> 10,
            encode_model(&whole).len() >> 10
        );
    }
    assert!(elided_in_all > 50, "the corpus has weights to leave out");
}

#[test]
fn onnxruntime_answers_a_skeleton_as_the_whole_model() {
    check(&*util::cpu_plugin("onnxruntime", "CPU"), "onnxruntime");
}

#[test]
fn tract_answers_a_skeleton_as_the_whole_model() {
    check(&*util::cpu_plugin("tract", "CPU"), "tract");
}

#[test]
fn the_gpu_answers_a_skeleton_as_the_whole_model() {
    if let Some(gpu) = util::gpu_plugin() {
        check(&gpu, "GPU");
    }
}
