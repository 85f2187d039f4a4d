//! Half precision on the GPU plugin where the adapter has shader-f16
//! (lavapipe and NVIDIA do): PP-OCR cls converted to float16 (every float
//! tensor and weight f16; the kernels store f16 and compute in f32) under
//! HETERO:GPU,CPU, against onnxruntime running it in float32 with the same
//! f16-rounded weights and inputs, max abs diff ≤ 1e-2 (cls answers
//! probabilities in [0, 1]; f16 has 11 significant bits); and Cast between
//! float32 and float16 inside one subgraph. (det and magika hold weights
//! beyond f16's range, 9.8e7 and inf: not f16 models.) Skipped, saying so, where there is no adapter (unless
//! TESSERA_GPU_TESTS=required) or it lacks shader-f16.

use crate::util;

use std::sync::Arc;

use tessera_common::affinity::{DeviceId, DevicePriority};
use tessera_common::graph::Graph;
use tessera_common::onnx::proto::{attribute_proto::AttributeType, AttributeProto, GraphProto};
use tessera_common::onnx::{encode_model, load_model, tensor_info, ElemType};
use tessera_common::synth::{node, opset17, random_inputs, to_float16, to_float32};
use tessera_common::tensor::Tensor;
use tessera_worker::hetero::{LoadOptions, Network};
use tessera_worker::plugin::{Config, DevicePlugin};
use tessera_worker::plugins::cpu::CpuPlugin;
use tessera_worker::plugins::gpu::GpuPlugin;

const TOLERANCE: f32 = 1e-2;

/// The plugin where it can run f16, else `None` after saying why.
fn half_gpu() -> Option<GpuPlugin> {
    let gpu = util::gpu_plugin()?;
    let caps = gpu.metric("OPTIMIZATION_CAPABILITIES").unwrap().to_string();
    if !caps.contains("FP16") {
        println!("SKIPPED: this adapter has no shader-f16 ({caps})");
        return None;
    }
    Some(gpu)
}

/// `t` rounded to f16, as f16 and back as f32.
fn rounded(t: &Tensor) -> (Tensor, Tensor) {
    let half: Vec<half::f16> = t
        .float_values()
        .unwrap()
        .into_iter()
        .map(half::f16::from_f32)
        .collect();
    let back: Vec<f32> = half.iter().map(|h| h.to_f32()).collect();
    (
        Tensor::from_values(t.shape().to_vec(), &half).unwrap(),
        Tensor::from_values(t.shape().to_vec(), &back).unwrap(),
    )
}

#[test]
fn cls_in_float16_matches_onnxruntime_on_its_rounded_weights() {
    let Some(gpu) = half_gpu() else { return };
    let model = load_model(util::model_path("ch_ppocr_mobile_v2.0_cls_infer.onnx")).unwrap();
    let graph = Graph::from_model(model.clone()).unwrap();
    let (name, x) = random_inputs(&graph, 5).expect("float inputs").remove(0);
    let (x16, x32) = rounded(&x);
    let half_model = to_float16(&model);
    let tmp = std::env::temp_dir().join(format!("tessera-gpu-half-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let rounded_model = tmp.join("cls_f16_weights.onnx");
    std::fs::write(&rounded_model, encode_model(&to_float32(&half_model))).unwrap();
    let want = util::onnxruntime(&rounded_model, &[(name.clone(), x32)], &tmp);
    let plugins: Vec<(DeviceId, Arc<dyn DevicePlugin>)> = vec![
        (DeviceId::parse("GPU").unwrap(), Arc::new(gpu)),
        (
            DeviceId::parse("CPU").unwrap(),
            Arc::new(CpuPlugin::new().unwrap()),
        ),
    ];
    let options = LoadOptions::by_priority(DevicePriority::parse("HETERO:GPU,CPU").unwrap());
    let network = Network::load(half_model, &plugins, &options).expect("cls in f16 loads");
    let part = network.partition();
    let on_gpu: usize = part
        .subgraphs
        .iter()
        .filter(|sg| part.device_of(sg).to_string() == "GPU")
        .map(|sg| sg.nodes.len())
        .sum();
    let result = network.run(&[(name, x16)].into()).expect("runs");
    let out = &result.outputs[0].1;
    assert_eq!(out.elem(), ElemType::FLOAT16);
    assert_eq!(out.shape(), want[0].shape());
    let (a, b) = (out.float_values().unwrap(), want[0].float_values().unwrap());
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    println!(
        "cls in f16, {on_gpu} nodes on the GPU: outputs {b:?}, max abs diff vs onnxruntime f32 {diff:e}"
    );
    assert!(on_gpu > 200, "only {on_gpu} nodes on the GPU");
    assert!(diff <= TOLERANCE, "max abs diff {diff}");
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn cast_between_float32_and_float16_inside_one_subgraph() {
    let Some(gpu) = half_gpu() else { return };
    let cast = |name: &str, from: &str, to: &str, elem: i64| {
        let mut n = node(name, "Cast", &[from], &[to]);
        n.attribute.push(AttributeProto {
            name: Some("to".into()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(elem),
            ..Default::default()
        });
        n
    };
    // y = float32(relu(float16(x))) * 2
    let g = GraphProto {
        name: Some("casts".into()),
        node: vec![
            cast("to_half", "x", "h", 10),
            node("relu", "Relu", &["h"], &["r"]),
            cast("to_float", "r", "f", 1),
            node("double", "Add", &["f", "f"], &["y"]),
        ],
        input: vec![tensor_info("x", 1, &[3, 5])],
        output: vec![tensor_info("y", 1, &[3, 5])],
        ..Default::default()
    };
    let compiled = gpu
        .compile(&encode_model(&opset17(g)).into(), &Config::default())
        .expect("compiles");
    let x: Vec<f32> = (0..15).map(|i| (i as f32 - 7.0) * 0.3337).collect();
    let got = compiled
        .infer(&[Tensor::from_values(vec![3, 5], &x).unwrap()])
        .expect("runs");
    let y = got.outputs[0].to_vec::<f32>().unwrap();
    for (v, g) in x.iter().zip(&y) {
        let want = 2.0 * half::f16::from_f32(*v).to_f32().max(0.0);
        assert_eq!(*g, want, "x = {v}");
    }
}
