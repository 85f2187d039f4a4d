//! End to end on a real cluster: a `coordinator` and two `worker`
//! processes on loopback QUIC with mutual TLS, driven through the client
//! SDK. Results are checked against onnxruntime on the same seeded inputs
//! (max abs diff ≤ 1e-4).

use crate::util;

use std::collections::HashSet;
use std::time::Instant;

use tessera_client::LoadOptions;
use tessera_common::graph::Graph;
use tessera_common::onnx::{decode_model, encode_model};
use tessera_common::synth::{self, Rng};
use tessera_common::tensor::Tensor;
use util::cluster::Cluster;
use util::oracle::{max_abs_diff, onnxruntime, onnxruntime_many};
use util::runtime;

const TOLERANCE: f32 = 1e-4;

/// Every op node of `graph` on node-a or node-b: `split` decides by the
/// node's position in topological order.
fn affinity(graph: &Graph, mut split: impl FnMut(usize, usize) -> bool) -> Vec<(String, String)> {
    let ops = graph.topo_ops();
    let n = ops.len();
    ops.iter()
        .enumerate()
        .map(|(i, &op)| {
            let host = if split(i, n) { "node-b" } else { "node-a" };
            (graph.node(op).name.clone(), format!("{host}/CPU"))
        })
        .collect()
}

#[test]
fn ppocr_det_and_rec_split_across_two_workers_match_onnxruntime() {
    let cluster = Cluster::start("ppocr", &["node-a", "node-b"], 1);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        for (name, how) in [
            ("ch_PP-OCRv4_det_infer.onnx", "halves"),
            ("ch_PP-OCRv4_rec_infer.onnx", "seeded random"),
        ] {
            let path = util::model(name);
            let bytes = std::fs::read(&path).unwrap();
            let graph = Graph::from_model(decode_model(&bytes).unwrap()).unwrap();
            let mut rng = Rng::new(3);
            let affinity = match how {
                "halves" => affinity(&graph, |i, n| i >= n / 2),
                _ => affinity(&graph, |_, _| rng.chance(0.5)),
            };
            let options = LoadOptions {
                devices: "HETERO:node-a/CPU,node-b/CPU".into(),
                strict: true,
                affinity,
                ..Default::default()
            };
            let mut steps = Vec::new();
            let network = client
                .load_network_with_progress(bytes, options, |what, done, total| {
                    steps.push(format!("{what} {done}/{total}"))
                })
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let plan = network.plan();
            let hosts: HashSet<&str> = plan
                .subgraphs
                .iter()
                .map(|s| s.device.split('/').next().unwrap())
                .collect();
            assert_eq!(hosts.len(), 2, "{name}: both workers used");
            assert!(
                steps.iter().any(|s| s.starts_with("deployed subgraphs")),
                "{name}: progress was reported: {steps:?}"
            );
            let mut inputs = synth::random_inputs(&graph, 11).unwrap();
            if how == "halves" {
                // det on a 160 x 160 image (300 KB), larger than the
                // smallest tensor shared memory takes.
                let pixels: Vec<f32> = (0..3 * 160 * 160)
                    .map(|_| rng.below(1000) as f32 / 500.0 - 1.0)
                    .collect();
                inputs[0].1 = Tensor::from_values(vec![1, 3, 160, 160], &pixels).unwrap();
            }
            let want = onnxruntime(&path, &inputs, &cluster.dir.join(name));
            let placed = tessera_net::shared::bytes_placed();
            let started = Instant::now();
            let got = network
                .infer(inputs.clone())
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let elapsed = started.elapsed();
            // The workers are processes on this host: the requester's large
            // inputs went through shared memory, not QUIC.
            let large: u64 = inputs
                .iter()
                .map(|(_, t)| t.bytes().len() as u64)
                .filter(|&n| n >= tessera_net::shared::MIN_SHARED as u64)
                .sum();
            if tessera_net::shared::enabled() && std::path::Path::new("/dev/shm").is_dir() {
                let through = tessera_net::shared::bytes_placed() - placed;
                assert!(
                    through >= large,
                    "{name}: {through} of {large} bytes shared"
                );
                assert!(how != "halves" || large > 0, "{name}: no large input");
            }
            assert_eq!(got.tensors.len(), want.len());
            let diff = got
                .tensors
                .iter()
                .zip(&want)
                .map(|((_, g), w)| max_abs_diff(g, w))
                .fold(0.0, f32::max);
            println!(
                "{name} split by {how} over node-a and node-b: {} subgraphs, {:.1} ms, \
                 max abs diff vs onnxruntime {diff:e}",
                plan.subgraphs.len(),
                elapsed.as_secs_f64() * 1e3
            );
            assert!(diff <= TOLERANCE, "{name}: max abs diff {diff}");
            // Subgraphs ahead of the last may report after the outputs came.
            assert!(
                !got.subgraphs.is_empty() && got.subgraphs.len() <= plan.subgraphs.len(),
                "subgraph times: {:?}",
                got.subgraphs
            );
            network.unload().await.unwrap();
        }
    });
}

/// `model` loaded with its first half of nodes on node-a, the rest on
/// node-b.
async fn load_halves(
    cluster: &Cluster,
    model: &tessera_common::onnx::proto::ModelProto,
    graph: &Graph,
) -> tessera_client::Network {
    let options = LoadOptions {
        devices: "HETERO:node-a/CPU,node-b/CPU".into(),
        affinity: affinity(graph, |i, n| i >= n / 2),
        ..Default::default()
    };
    let client = cluster.client().await;
    client
        .load_network(encode_model(model), options)
        .await
        .unwrap()
}

#[test]
fn sixty_four_concurrent_requests_complete_correctly_and_in_order() {
    let cluster = Cluster::start("pipeline", &["node-a", "node-b"], 1);
    let model = synth::small_cnn(7);
    let path = cluster.dir.join("small_cnn.onnx");
    std::fs::write(&path, encode_model(&model)).unwrap();
    let graph = Graph::from_model(model.clone()).unwrap();
    let requests: Vec<Vec<(String, Tensor)>> = (0..64)
        .map(|seed| synth::random_inputs(&graph, seed).unwrap())
        .collect();
    let want = onnxruntime_many(&path, &requests, &cluster.dir.join("ort"));
    let rt = runtime();
    rt.block_on(async {
        let network = load_halves(&cluster, &model, &graph).await;
        assert_eq!(network.plan().subgraphs.len(), 2);
        let results = network.infer_many(requests.clone()).await;
        assert_eq!(results.len(), 64);
        for (i, (got, want)) in results.into_iter().zip(&want).enumerate() {
            let got = got.unwrap_or_else(|e| panic!("request {i}: {e}"));
            let diff = max_abs_diff(&got.tensors[0].1, &want[0]);
            assert!(diff <= TOLERANCE, "request {i}: max abs diff {diff}");
        }
        // Distinct inputs give distinct outputs, so the order is checked too.
        assert_ne!(want[0][0], want[1][0]);
        network.unload().await.unwrap();
    });
}

#[test]
fn rec_split_between_a_gpu_worker_and_a_cpu_worker_matches_onnxruntime() {
    if let Err(e) = tessera_worker::plugins::gpu::GpuPlugin::new() {
        if std::env::var("TESSERA_GPU_TESTS").as_deref() == Ok("required") {
            panic!("{e}");
        }
        println!("SKIPPED: {e}");
        return;
    }
    let cluster = Cluster::start_with("gpu-cpu", &[("node-a", "GPU"), ("node-b", "CPU")], 1);
    let path = util::model("ch_PP-OCRv4_rec_infer.onnx");
    let bytes = std::fs::read(&path).unwrap();
    let graph = Graph::from_model(decode_model(&bytes).unwrap()).unwrap();
    let inputs = synth::random_inputs(&graph, 9).unwrap();
    let want = onnxruntime(&path, &inputs, &cluster.dir.join("ort"));
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let network = client
            .load_network(bytes, LoadOptions::devices("HETERO:node-a/GPU,node-b/CPU"))
            .await
            .unwrap();
        let plan = network.plan();
        let on = |device: &str| {
            plan.subgraphs
                .iter()
                .filter(|s| s.device == device)
                .map(|s| s.nodes.len())
                .sum::<usize>()
        };
        let (gpu, cpu) = (on("node-a/GPU"), on("node-b/CPU"));
        let got = network.infer(inputs.clone()).await.unwrap();
        let diff = max_abs_diff(&got.tensors[0].1, &want[0]);
        println!(
            "PP-OCRv4 rec over node-a/GPU and node-b/CPU: {} subgraphs, {gpu} nodes on the GPU, \
             {cpu} on the CPU; max abs diff vs onnxruntime {diff:e}",
            plan.subgraphs.len()
        );
        assert!(gpu > cpu, "most nodes run on the GPU");
        assert!(cpu > 0, "the GPU plugin's gaps fall back to the CPU worker");
        assert!(diff <= 1e-3, "max abs diff {diff}");
    });
}

/// With `RUST_LOG=tessera=debug` on every process, one request reads end
/// to end under the id its requester gave it: the subgraph runs and the
/// tensor sent between the workers, the outputs going back; and the
/// coordinator never hears of it (it is off the data path).
#[test]
fn one_request_is_traced_across_both_workers_and_never_reaches_the_coordinator() {
    let workers = [("node-a", "CPU"), ("node-b", "CPU")];
    let cluster = Cluster::start_logged("traced", &workers, 1, "", "tessera=debug");
    let model = synth::small_cnn(7);
    let graph = Graph::from_model(model.clone()).unwrap();
    let inputs = synth::random_inputs(&graph, 1).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let network = load_halves(&cluster, &model, &graph).await;
        network.infer(inputs).await.unwrap();
        network.unload().await.unwrap();
    });
    let (a, b) = (cluster.workers[0].log_text(), cluster.workers[1].log_text());
    // The first worker's run names the request id.
    let id = a
        .lines()
        .find_map(|l| {
            let at = l.find("subgraph_run{request=")? + "subgraph_run{request=".len();
            let digits: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u64>().ok()
        })
        .unwrap_or_else(|| panic!("no subgraph_run span in node-a's log:\n{a}"));
    let request = format!("request={id}");
    let has = |log: &str, what: &str| {
        log.lines()
            .any(|l| l.contains(&request) && l.contains(what))
    };
    for (name, log) in [("node-a", &a), ("node-b", &b)] {
        assert!(
            has(log, "subgraph_run{"),
            "{name} ran no subgraph of {request}:\n{log}"
        );
        assert!(
            has(log, "tensor arrived"),
            "{name} got no tensor of {request}:\n{log}"
        );
        assert!(
            has(log, "deliver{"),
            "{name} delivered nothing of {request}:\n{log}"
        );
    }
    // The intermediate tensor went node-a → node-b, both ends logged.
    assert!(
        a.lines()
            .any(|l| l.contains(&request) && l.contains(" sent ") && l.contains("node-b")),
        "{a}"
    );
    let coordinator = cluster.coordinator.log_text();
    assert!(coordinator.contains("deploy{network="), "{coordinator}");
    assert!(
        !coordinator.contains(&request),
        "the coordinator saw {request}:\n{coordinator}"
    );
    println!("{request} traced on node-a and node-b, never on the coordinator");
}

/// A model whose string tensor crosses from one worker to the other and
/// back to the client: `Cast(x → STRING)` on node-a; on node-b the strings
/// parsed back (`Cast → FLOAT`) and joined to themselves (`StringConcat`).
#[test]
fn string_tensors_cross_workers_and_reach_the_client() {
    use tessera_common::onnx::proto::{
        attribute_proto::AttributeType, AttributeProto, GraphProto, ModelProto, OperatorSetIdProto,
    };
    use tessera_common::onnx::{tensor_info, ElemType};
    let to = |elem: ElemType| AttributeProto {
        name: Some("to".into()),
        i: Some(i64::from(elem.0)),
        r#type: Some(AttributeType::Int as i32),
        ..Default::default()
    };
    let mut as_text = synth::node("as_text", "Cast", &["x"], &["s"]);
    as_text.attribute.push(to(ElemType::STRING));
    let mut parse = synth::node("parse", "Cast", &["s"], &["y"]);
    parse.attribute.push(to(ElemType::FLOAT));
    let join = synth::node("join", "StringConcat", &["s", "s"], &["t"]);
    let model = ModelProto {
        ir_version: Some(9),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(20),
        }],
        graph: Some(GraphProto {
            name: Some("strings".into()),
            node: vec![as_text, parse, join],
            input: vec![tensor_info("x", 1, &[2, 3])],
            output: vec![tensor_info("y", 1, &[2, 3]), tensor_info("t", 8, &[2, 3])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let cluster = Cluster::start("strings", &["node-a", "node-b"], 1);
    let x = [0.5f32, -1.25, 3.0e-5, 1234.5, -0.0, 7.0];
    let rt = runtime();
    rt.block_on(async {
        let options = LoadOptions {
            devices: "HETERO:node-a/CPU,node-b/CPU".into(),
            affinity: vec![
                ("as_text".into(), "node-a/CPU".into()),
                ("parse".into(), "node-b/CPU".into()),
                ("join".into(), "node-b/CPU".into()),
            ],
            ..Default::default()
        };
        let client = cluster.client().await;
        let network = client
            .load_network(encode_model(&model), options)
            .await
            .unwrap();
        // node-a's subgraph, and node-b's (its two independent nodes may
        // go as one subgraph or two).
        assert!(network.plan().subgraphs.len() >= 2);
        let input = Tensor::from_values(vec![2, 3], &x).unwrap();
        let got = network.infer(vec![("x".into(), input)]).await.unwrap();
        let output = |name: &str| {
            got.tensors
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.clone())
                .unwrap_or_else(|| panic!("no output {name}"))
        };
        // Eight significant digits round-trip a float32 exactly.
        assert_eq!(output("y").to_vec::<f32>().unwrap(), x);
        let t = output("t");
        assert_eq!(t.elem(), ElemType::STRING);
        assert_eq!(t.shape(), [2, 3]);
        for (joined, want) in t.strings().unwrap().into_iter().zip(x) {
            let text = std::str::from_utf8(joined).unwrap();
            let (a, b) = text.split_at(text.len() / 2);
            assert_eq!(a, b, "{text}");
            assert_eq!(a.parse::<f32>().unwrap(), want, "{text}");
        }
        network.unload().await.unwrap();
    });
}
