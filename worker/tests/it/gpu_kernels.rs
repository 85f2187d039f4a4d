//! GPU kernels on shapes the ONNX node tests do not reach, against
//! onnxruntime (max abs diff ≤ 1e-4): Conv with many output channels per
//! group (the implicit-GEMM kernel: sizes that are not multiples of its
//! 64×64 tiles, batches, groups, strides, dilations, asymmetric pads,
//! auto_pad, 1-D, non-square kernels, 1×1, k split across workgroups for
//! thin convs) and thin ones (the direct kernel); Softmax / LogSoftmax over
//! long rows (a workgroup per row) and global pooling over large planes;
//! and an integer graph input refused at compile, by name.
//! Skipped, saying so, without a GPU adapter unless TESSERA_GPU_TESTS=required.

use crate::util;

use tessera_common::graph::Graph;
use tessera_common::onnx::proto::{attribute_proto::AttributeType, AttributeProto, GraphProto};
use tessera_common::onnx::{encode_model, tensor_info};
use tessera_common::synth::{node, opset17, random_inputs};
use tessera_worker::plugin::{Config, DevicePlugin};
use tessera_worker::plugins::gpu::GpuPlugin;

const TOLERANCE: f32 = 1e-4;

/// One Conv: input, weight and bias shapes and its attributes.
struct Case {
    name: &'static str,
    x: &'static [i64],
    w: &'static [i64],
    bias: bool,
    ints: &'static [(&'static str, &'static [i64])],
    auto_pad: Option<&'static str>,
    group: i64,
}

const CASES: &[Case] = &[
    Case {
        name: "batch2_m70_k3_stride2_pad1",
        x: &[2, 3, 37, 37],
        w: &[70, 3, 3, 3],
        bias: true,
        ints: &[("strides", &[2, 2]), ("pads", &[1, 1, 1, 1])],
        auto_pad: None,
        group: 1,
    },
    Case {
        name: "pointwise_c40_m64",
        x: &[1, 40, 20, 21],
        w: &[64, 40, 1, 1],
        bias: false,
        ints: &[],
        auto_pad: None,
        group: 1,
    },
    Case {
        name: "groups2_dilation2_asymmetric_pads",
        x: &[1, 16, 19, 23],
        w: &[40, 8, 3, 3],
        bias: true,
        ints: &[("dilations", &[2, 2]), ("pads", &[1, 0, 2, 1])],
        auto_pad: None,
        group: 2,
    },
    Case {
        name: "conv1d_same_upper_stride3",
        x: &[2, 8, 50],
        w: &[24, 8, 5],
        bias: true,
        ints: &[("strides", &[3])],
        auto_pad: Some("SAME_UPPER"),
        group: 1,
    },
    Case {
        name: "kernel5x3_stride1x2_k_not_multiple_of_16",
        x: &[1, 7, 9, 71],
        w: &[17, 7, 5, 3],
        bias: true,
        ints: &[("strides", &[1, 2])],
        auto_pad: None,
        group: 1,
    },
    Case {
        // rec's neck: one position row, k = 1440 split across workgroups.
        name: "thin_long_k_split",
        x: &[1, 480, 1, 40],
        w: &[60, 480, 1, 3],
        bias: true,
        ints: &[("pads", &[0, 1, 0, 1])],
        auto_pad: None,
        group: 1,
    },
    Case {
        name: "split_k_batch2_groups2",
        x: &[2, 64, 6, 7],
        w: &[32, 32, 3, 3],
        bias: true,
        ints: &[("pads", &[1, 1, 1, 1])],
        auto_pad: None,
        group: 2,
    },
    Case {
        name: "depthwise_multiplier2_direct",
        x: &[1, 16, 15, 15],
        w: &[32, 1, 3, 3],
        bias: true,
        ints: &[("pads", &[1, 1, 1, 1])],
        auto_pad: None,
        group: 16,
    },
];

fn conv_model(case: &Case) -> Vec<u8> {
    let mut inputs = vec!["x", "w"];
    if case.bias {
        inputs.push("b");
    }
    let mut conv = node("conv", "Conv", &inputs, &["y"]);
    for (name, v) in case.ints {
        conv.attribute.push(AttributeProto {
            name: Some(name.to_string()),
            r#type: Some(AttributeType::Ints as i32),
            ints: v.to_vec(),
            ..Default::default()
        });
    }
    conv.attribute.push(AttributeProto {
        name: Some("group".into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(case.group),
        ..Default::default()
    });
    if let Some(pad) = case.auto_pad {
        conv.attribute.push(AttributeProto {
            name: Some("auto_pad".into()),
            r#type: Some(AttributeType::String as i32),
            s: Some(pad.as_bytes().to_vec()),
            ..Default::default()
        });
    }
    let mut input = vec![tensor_info("x", 1, case.x), tensor_info("w", 1, case.w)];
    if case.bias {
        input.push(tensor_info("b", 1, &[case.w[0]]));
    }
    let g = GraphProto {
        name: Some(case.name.into()),
        node: vec![conv],
        input,
        // Output shape left to the runtimes.
        output: vec![tessera_common::onnx::proto::ValueInfoProto {
            name: Some("y".into()),
            ..Default::default()
        }],
        ..Default::default()
    };
    encode_model(&opset17(g))
}

/// Runs each (name, model) on the GPU and onnxruntime on seeded inputs;
/// asserts the outputs agree within TOLERANCE.
fn check_against_onnxruntime(gpu: &GpuPlugin, models: &[(String, Vec<u8>)]) {
    let tmp = std::env::temp_dir().join(format!(
        "tessera-gpu-kernels-{}-{}",
        std::process::id(),
        models[0].0
    ));
    std::fs::create_dir_all(&tmp).unwrap();
    for (i, (name, onnx)) in models.iter().enumerate() {
        let path = tmp.join(format!("{}.onnx", name));
        std::fs::write(&path, onnx).unwrap();
        let model = tessera_common::onnx::decode_model(onnx).unwrap();
        let graph = Graph::from_model(model).unwrap();
        let inputs = random_inputs(&graph, 100 + i as u64).expect("float inputs");
        let want = util::onnxruntime(&path, &inputs, &tmp.join(name));
        let compiled = gpu
            .compile(&onnx.clone().into(), &Config::default())
            .unwrap_or_else(|e| panic!("{}: {e}", name));
        let tensors: Vec<_> = inputs.into_iter().map(|(_, t)| t).collect();
        let got = compiled
            .infer(&tensors)
            .unwrap_or_else(|e| panic!("{}: {e}", name));
        assert_eq!(got.outputs[0].shape(), want[0].shape(), "{}", name);
        let diff = util::max_abs_diff(&got.outputs[0], &want[0]);
        println!(
            "{}: output {:?}, max abs diff vs onnxruntime {diff:e}",
            name,
            want[0].shape()
        );
        assert!(diff <= TOLERANCE, "{}: max abs diff {diff}", name);
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn gpu_conv_matches_onnxruntime_on_shapes_the_node_tests_miss() {
    let Some(gpu) = util::gpu_plugin() else {
        return;
    };
    let models: Vec<(String, Vec<u8>)> = CASES
        .iter()
        .map(|c| (c.name.to_string(), conv_model(c)))
        .collect();
    check_against_onnxruntime(&gpu, &models);
}

/// A one-node model of `op` on input `x` of `shape` with int attributes.
fn one_node(op: &str, shape: &[i64], ints: &[(&str, i64)]) -> Vec<u8> {
    let mut n = node("n", op, &["x"], &["y"]);
    for (name, v) in ints {
        n.attribute.push(AttributeProto {
            name: Some(name.to_string()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(*v),
            ..Default::default()
        });
    }
    let g = GraphProto {
        name: Some(op.into()),
        node: vec![n],
        input: vec![tensor_info("x", 1, shape)],
        output: vec![tessera_common::onnx::proto::ValueInfoProto {
            name: Some("y".into()),
            ..Default::default()
        }],
        ..Default::default()
    };
    encode_model(&opset17(g))
}

#[test]
fn gpu_softmax_and_global_pooling_match_onnxruntime_on_long_axes() {
    let Some(gpu) = util::gpu_plugin() else {
        return;
    };
    let models = vec![
        // rec's CTC head: rows of 6625 classes.
        (
            "softmax_last_axis_6625".to_string(),
            one_node("Softmax", &[1, 4, 6625], &[("axis", 2)]),
        ),
        (
            "log_softmax_strided_rows".to_string(),
            one_node("LogSoftmax", &[2, 700, 3], &[("axis", 1)]),
        ),
        (
            "global_average_pool_40x45".to_string(),
            one_node("GlobalAveragePool", &[1, 8, 40, 45], &[]),
        ),
        (
            "global_max_pool_40x45".to_string(),
            one_node("GlobalMaxPool", &[2, 3, 40, 45], &[]),
        ),
    ];
    check_against_onnxruntime(&gpu, &models);
}

#[test]
fn gpu_refuses_a_subgraph_with_an_integer_input_by_name() {
    let Some(gpu) = util::gpu_plugin() else {
        return;
    };
    let g = GraphProto {
        name: Some("ints".into()),
        node: vec![node("n", "Relu", &["x"], &["y"])],
        input: vec![tensor_info("x", 7, &[4])],
        output: vec![tensor_info("y", 7, &[4])],
        ..Default::default()
    };
    let err = gpu
        .compile(&encode_model(&opset17(g)).into(), &Config::default())
        .err()
        .expect("an int64 input is refused");
    assert!(err.to_string().contains("'x' is INT64"), "{err}");
}
