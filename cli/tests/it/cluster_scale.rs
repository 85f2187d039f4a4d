//! Scaling out: replicas balanced over workers, dynamic batching, and a
//! coordinator holding 64 workers.
//!
//! - Replicas and batching run on real `coordinator` and `worker`
//!   processes over loopback QUIC; every answer is checked against
//!   onnxruntime on the same inputs (max abs diff ≤ 1e-4).
//! - The 64-worker cluster is embedded (one process, real QUIC between
//!   64 worker endpoints, one compute thread per subgraph): a 64-stage
//!   split of a deep synthetic model and 64 replicas of a small CNN,
//!   10,000 requests, 8 workers stopped at once under load, none lost.

use crate::util;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_client::{Client, ErrorKind, LoadOptions, Replicas};
use tessera_common::graph::Graph;
use tessera_common::onnx::{decode_model, encode_model};
use tessera_common::synth;
use tessera_common::tensor::Tensor;
use util::cluster::Cluster;
use util::oracle::{max_abs_diff, onnxruntime_many};
use util::runtime;

const TOLERANCE: f32 = 1e-4;

fn cases(graph: &Graph, n: u64, seed: u64) -> Vec<Vec<(String, Tensor)>> {
    (0..n)
        .map(|i| synth::random_inputs(graph, seed + i).unwrap())
        .collect()
}

#[test]
fn replicas_share_the_load_and_a_lost_copy_loses_no_request() {
    let mut cluster = Cluster::start("scale-replicas", &["node-a", "node-b"], 1);
    let path = util::model("ch_ppocr_mobile_v2.0_cls_infer.onnx");
    let bytes = std::fs::read(&path).unwrap();
    let graph = Graph::from_model(decode_model(&bytes).unwrap()).unwrap();
    let cases = cases(&graph, 8, 70);
    let want = onnxruntime_many(&path, &cases, &cluster.dir.join("ort"));
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let options = LoadOptions::devices("CPU").replicas(Replicas::Count(2));
        let network = Arc::new(client.load_network(bytes.clone(), options).await.unwrap());
        let plan = network.plan();
        let mut hosts: Vec<String> = plan.replicas.iter().map(|r| r.hosts.join(",")).collect();
        hosts.sort();
        assert_eq!(hosts, ["node-a", "node-b"], "one whole copy on each worker");
        assert!(plan.predicted_rps > 0.0);
        // 32 requests, 8 in flight: both copies answer.
        let run = |network: Arc<tessera_client::Network>, n: usize| {
            let want = want.clone();
            let cases = cases.clone();
            async move {
                let mut deployments = BTreeSet::new();
                let all = (0..n).map(|i| {
                    let network = network.clone();
                    let case = cases[i % cases.len()].clone();
                    async move { (i, network.infer(case).await) }
                });
                let answers = futures_util::stream::iter(all)
                    .buffer_unordered(8)
                    .collect::<Vec<_>>()
                    .await;
                for (i, out) in answers {
                    let out = out.unwrap_or_else(|e| panic!("request {i}: {e}"));
                    let diff = max_abs_diff(&out.tensors[0].1, &want[i % cases.len()][0]);
                    assert!(diff <= TOLERANCE, "request {i}: {diff}");
                    deployments.insert(out.deployment);
                }
                deployments
            }
        };
        use futures_util::StreamExt;
        let used = run(network.clone(), 32).await;
        assert_eq!(used.len(), 2, "requests went to both copies: {used:?}");
        // One copy's worker killed under load: its requests are retried on
        // the other copy.
        let load = tokio::spawn(run(network.clone(), 48));
        tokio::time::sleep(Duration::from_millis(300)).await;
        cluster.workers[1].kill();
        let after = load.await.unwrap();
        assert!(!after.is_empty());
        // Later requests all go to the copy that remains.
        let last = run(network.clone(), 8).await;
        assert_eq!(last.len(), 1, "{last:?}");
    });
}

#[test]
fn batching_answers_each_request_with_exactly_its_own_rows() {
    let cluster = Cluster::start_logged(
        "scale-batching",
        &[("node-a", "CPU")],
        1,
        "",
        "info,tessera_worker=debug",
    );
    let rt = runtime();
    let mut batched_models = 0;
    for (name, width) in [
        ("ch_ppocr_mobile_v2.0_cls_infer.onnx", 192),
        ("ch_PP-OCRv4_rec_infer.onnx", 320),
        ("magika_standard_v3_3.onnx", 0),
        ("paraphrase-MiniLM-L3-v2.onnx", 0),
    ] {
        let path = util::model(name);
        let bytes = std::fs::read(&path).unwrap();
        let mut model = decode_model(&bytes).unwrap();
        // Fixed image sizes for the OCR models, batch left dynamic.
        if width > 0 {
            let input = &mut model.graph.as_mut().unwrap().input[0];
            let shape = match input.r#type.as_mut().and_then(|t| t.value.as_mut()) {
                Some(tessera_common::onnx::proto::type_proto::Value::TensorType(t)) => {
                    t.shape.as_mut().unwrap()
                }
                _ => unreachable!("an image input"),
            };
            for (d, v) in shape.dim.iter_mut().skip(2).zip([48, width]) {
                d.value = Some(
                    tessera_common::onnx::proto::tensor_shape_proto::dimension::Value::DimValue(v),
                );
            }
        }
        let graph = Graph::from_model(model.clone()).unwrap();
        let cases = cases(&graph, 12, 90);
        let want = onnxruntime_many(&path, &cases, &cluster.dir.join(format!("ort-{name}")));
        let bytes = encode_model(&model);
        rt.block_on(async {
            let client = cluster.client().await;
            let options = LoadOptions::devices("CPU").batching(8, Duration::from_millis(5));
            let network = client.load_network(bytes, options).await.unwrap();
            let network = &network;
            let all = (0..cases.len()).map(|i| {
                let case = cases[i].clone();
                async move { (i, network.infer(case).await) }
            });
            use futures_util::StreamExt;
            let answers: Vec<_> = futures_util::stream::iter(all)
                .buffer_unordered(12)
                .collect()
                .await;
            for (i, out) in answers {
                let out = out.unwrap_or_else(|e| panic!("{name} request {i}: {e}"));
                for (k, (_, got)) in out.tensors.iter().enumerate() {
                    assert_eq!(got.shape(), want[i][k].shape(), "{name} request {i}");
                    if got.float_values().is_some() {
                        let diff = max_abs_diff(got, &want[i][k]);
                        assert!(diff <= TOLERANCE, "{name} request {i} output {k}: {diff}");
                    } else {
                        assert_eq!(got, &want[i][k], "{name} request {i} output {k}");
                    }
                }
            }
        });
        batched_models += 1;
    }
    assert_eq!(batched_models, 4);
    // The worker ran batches of more than one request.
    let log = cluster.workers[0].log_text();
    let biggest = log
        .split("batch=")
        .skip(1)
        .filter_map(|s| {
            s.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<usize>()
                .ok()
        })
        .max()
        .unwrap_or(0);
    assert!(biggest > 1, "no batch of two or more in the worker's log");
    println!("batching: largest batch {biggest}");
}

#[test]
fn batching_a_model_with_a_static_batch_is_refused_with_the_input_named() {
    let cluster = Cluster::start("scale-static", &["node-a"], 1);
    let bytes = std::fs::read(util::model("silero_vad_16k_op15.onnx")).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let options = LoadOptions::devices("CPU").batching(4, Duration::from_micros(500));
        let Err(err) = client.load_network(bytes.clone(), options).await else {
            panic!("batching a static batch was accepted");
        };
        assert_eq!(err.kind(), ErrorKind::BadInput, "{err}");
        let text = err.to_string();
        assert!(text.contains("'state'") && text.contains("batch"), "{text}");
        let options = LoadOptions::devices("CPU").batching(1, Duration::ZERO);
        let Err(err) = client.load_network(bytes, options).await else {
            panic!("a batch of one was accepted");
        };
        assert!(err.to_string().contains("at least 2"), "{err}");
    });
}

/// A chain of `n` Sum nodes: the output equals the input.
fn deep_chain(n: usize) -> Vec<u8> {
    let dag = synth::Dag {
        nodes: n,
        edges: (0..n as u32 - 1).map(|i| (i, i + 1)).collect(),
    };
    encode_model(&synth::model_from_dag(&dag, None))
}

#[test]
fn sixty_four_workers_hold_a_deep_split_and_replicas_and_survive_losing_eight() {
    const WORKERS: usize = 64;
    const REQUESTS: usize = 10_000;
    const DEEP_EVERY: usize = 20;
    // Warnings (a worker that cannot register, a lost request) shown with
    // the test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
        .with_test_writer()
        .try_init();
    tessera_cli::cluster::run_system(async {
        let started = Instant::now();
        let config = [("NUM_THREADS".to_string(), "1".to_string())];
        let mut cluster =
            tessera_cli::cluster::start(WORKERS, &["CPU".to_string()], &config).await?;
        let registered = started.elapsed();
        let client =
            Client::connect(cluster.addr, &cluster.client, tessera_cli::cluster::CLUSTER).await?;
        let names = cluster.workers.clone();
        // A 64-stage split: node i of the chain pinned to worker i.
        let started = Instant::now();
        let deep = LoadOptions {
            devices: "CPU".into(),
            affinity: (0..WORKERS)
                .map(|i| (format!("n{i}"), format!("{}/CPU", names[i])))
                .collect(),
            ..Default::default()
        };
        let deep = Arc::new(client.load_network(deep_chain(WORKERS), deep).await?);
        assert_eq!(deep.plan().subgraphs.len(), WORKERS);
        assert_eq!(deep.plan().hosts.len(), WORKERS);
        let deep_ms = started.elapsed().as_millis();
        // 64 replicas of a small CNN, one on each worker.
        let started = Instant::now();
        let cnn = encode_model(&synth::small_cnn(5));
        let options = LoadOptions::devices("CPU").replicas(Replicas::Count(WORKERS as u32));
        let small = Arc::new(client.load_network(cnn.clone(), options).await?);
        assert_eq!(small.plan().replicas.len(), WORKERS);
        let replicas_ms = started.elapsed().as_millis();
        println!(
            "64 workers: registered in {} ms, 64-stage split loaded in {deep_ms} ms, \
             64 replicas in {replicas_ms} ms",
            registered.as_millis()
        );
        // One input each; the small CNN's answer from the first request is
        // the reference for every other (same backend, same input).
        let graph = Graph::from_model(synth::small_cnn(5))?;
        let image = synth::random_inputs(&graph, 3).expect("inputs for small_cnn");
        let reference = small.infer(image.clone()).await?;
        let x = Tensor::from_values(vec![4], &[1.5f32, -2.0, 0.25, 8.0])?;
        let done = Arc::new(AtomicUsize::new(0));
        let want = reference.tensors[0].1.clone();
        let (d, s, im, xx, dn) = (
            deep.clone(),
            small.clone(),
            image.clone(),
            x.clone(),
            done.clone(),
        );
        let all = (0..REQUESTS).map(move |i| {
            let (deep, small, image, x) = (d.clone(), s.clone(), im.clone(), xx.clone());
            let (done, want) = (dn.clone(), want.clone());
            async move {
                let answer = if i % DEEP_EVERY == 0 {
                    let out = deep.infer(vec![("x".to_string(), x.clone())]).await;
                    out.map(|o| max_abs_diff(&o.tensors[0].1, &x))
                } else {
                    let out = small.infer(image).await;
                    out.map(|o| max_abs_diff(&o.tensors[0].1, &want))
                };
                done.fetch_add(1, Ordering::Relaxed);
                (i, answer)
            }
        });
        let load = tokio::spawn(async move {
            use futures_util::StreamExt;
            futures_util::stream::iter(all)
                .buffer_unordered(64)
                .collect::<Vec<_>>()
                .await
        });
        while done.load(Ordering::Relaxed) < REQUESTS / 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let lost: Vec<&str> = names[8..16].iter().map(String::as_str).collect();
        let stopped_at = Instant::now();
        cluster.stop_workers(&lost)?;
        let answers = load.await?;
        let mut failures: HashMap<String, usize> = HashMap::new();
        for (i, answer) in &answers {
            match answer {
                Ok(diff) => assert!(*diff <= TOLERANCE, "request {i}: {diff}"),
                Err(e) => *failures.entry(e.to_string()).or_default() += 1,
            }
        }
        assert_eq!(answers.len(), REQUESTS);
        assert!(failures.is_empty(), "lost requests: {failures:?}");
        let cluster_now = client.cluster().await?;
        assert_eq!(cluster_now.workers.len(), WORKERS - 8);
        // The deep split was re-planned onto the 56 that remain.
        let out = deep.infer(vec![("x".to_string(), x.clone())]).await?;
        assert_eq!(max_abs_diff(&out.tensors[0].1, &x), 0.0);
        println!(
            "64 workers: {REQUESTS} requests, 8 workers stopped at once, 0 lost; \
             finished {:.1} s after the loss",
            stopped_at.elapsed().as_secs_f64()
        );
        cluster.shutdown().await;
        Ok(())
    })
    .unwrap();
}
