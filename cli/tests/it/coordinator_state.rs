//! A coordinator that keeps its state (`state_dir`), killed with SIGKILL:
//! the workers keep serving meanwhile, and the coordinator started again
//! serves what it kept (a model loaded with `tessera load`, under the same
//! network id) by adopting what the workers still run: they compile
//! nothing again, as their compile counters show. Without a coordinator
//! for longer than their `--adopt-grace-s`, workers unload. A coordinator
//! that lost a model's bytes serves it from its record's bones and takes
//! the weights back from the workers. Answers are checked against
//! onnxruntime.

use crate::util;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tessera_common::graph::Graph;
use tessera_common::onnx::encode_model;
use tessera_common::onnx::proto::ModelProto;
use tessera_common::synth;
use tessera_common::tensor::Tensor;
use tessera_common::wire::control::CompileCounts;
use util::cluster::Cluster;
use util::oracle::{max_abs_diff, onnxruntime_many};
use util::{runtime, tessera};

const TOLERANCE: f32 = 1e-4;
const DEADLINE: Duration = Duration::from_secs(30);

/// A small CNN split over node-a and node-b ([`split`]).
fn split_cnn(cluster: &Cluster) -> (Vec<(String, Tensor)>, Vec<Tensor>) {
    split(cluster, "cnn", synth::small_cnn(11))
}

/// `model` split over node-a and node-b by a manual affinity (written to
/// `<name>.onnx` and `<name>-affinity.json` in the cluster's folder), its
/// inputs and onnxruntime's outputs.
fn split(cluster: &Cluster, name: &str, model: ModelProto) -> (Vec<(String, Tensor)>, Vec<Tensor>) {
    let file = cluster.dir.join(format!("{name}.onnx"));
    std::fs::write(&file, encode_model(&model)).unwrap();
    let graph = Graph::from_model(model).unwrap();
    let ops = graph.topo_ops();
    let half = ops.len().div_ceil(2);
    let affinity: BTreeMap<String, String> = ops
        .iter()
        .enumerate()
        .map(|(i, &op)| {
            let host = if i < half { "node-a" } else { "node-b" };
            (graph.node(op).name.clone(), format!("{host}/CPU"))
        })
        .collect();
    let json = serde_json::to_string(&affinity).unwrap();
    std::fs::write(cluster.dir.join(format!("{name}-affinity.json")), json).unwrap();
    let inputs = synth::random_inputs(&graph, 5).unwrap();
    let want = onnxruntime_many(
        &file,
        std::slice::from_ref(&inputs),
        &cluster.dir.join("ort"),
    );
    (inputs, want[0].clone())
}

/// `tessera load cnn` with the split affinity.
fn load_cnn(cluster: &Cluster) {
    load_split(cluster, "cnn")
}

/// `tessera load <name>` with the split affinity ([`split`]): the client
/// sends the model's bytes.
fn load_split(cluster: &Cluster, name: &str) {
    let (model, affinity) = (
        cluster.dir.join(format!("{name}.onnx")),
        cluster.dir.join(format!("{name}-affinity.json")),
    );
    let mut args = vec![
        "load".to_string(),
        name.into(),
        model.display().to_string(),
        "--devices".into(),
        "HETERO:node-a/CPU,node-b/CPU".into(),
        "--affinity".into(),
        affinity.display().to_string(),
    ];
    args.extend(cluster.client_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = tessera(&args);
    assert!(ok, "tessera load: {out}{err}");
}

/// Each worker's compile counters, once both are registered and have
/// reported compiling (or loading from their cache) something.
async fn compiles(cluster: &Cluster) -> BTreeMap<String, CompileCounts> {
    let started = Instant::now();
    loop {
        if let Ok(client) = tessera_client::Client::connect(
            cluster.addr,
            &tessera_net::certs::load_identity(&cluster.certs, "client").unwrap(),
            util::cluster::CLUSTER,
        )
        .await
        {
            if let Ok(state) = client.cluster().await {
                let reported = |c: &CompileCounts| c.compiled + c.cache_loads > 0;
                if state.workers.len() == 2 && state.workers.iter().all(|w| reported(&w.compiles)) {
                    return state
                        .workers
                        .into_iter()
                        .map(|w| (w.name, w.compiles))
                        .collect();
                }
            }
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the workers did not register again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_killed_coordinator_comes_back_with_its_models_and_adopts_without_compiling() {
    let mut cluster = Cluster::start_configured(
        "state-restart",
        &[("node-a", "CPU"), ("node-b", "CPU")],
        1,
        "state_dir = \"{dir}/state\"\n",
    );
    let (inputs, want) = split_cnn(&cluster);
    load_cnn(&cluster);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let network = client.model("cnn").await.unwrap().with_deadline(DEADLINE);
        let id = network.id();
        let got = network.infer(inputs.clone()).await.unwrap();
        assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE);
        let before = compiles(&cluster).await;

        // SIGKILL: nothing is flushed. The requester keeps its routing
        // table and the workers keep serving.
        cluster.coordinator.kill();
        for _ in 0..5 {
            let got = network.infer(inputs.clone()).await.unwrap();
            assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE);
        }
        println!("5 requests answered while no coordinator ran");

        let restarted = Instant::now();
        cluster.start_coordinator_again();
        let after = compiles(&cluster).await;
        println!(
            "restarted: both workers registered again within {:.2} s",
            restarted.elapsed().as_secs_f64()
        );
        // Nobody loads it again: a new client finds it under its name and
        // network id, and the workers compiled nothing for it.
        let again = cluster.client().await;
        let served = again.model("cnn").await.unwrap().with_deadline(DEADLINE);
        assert_eq!(served.id(), id, "the same network, not a new one");
        let got = served.infer(inputs.clone()).await.unwrap();
        assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE);
        let got = network.infer(inputs.clone()).await.unwrap();
        assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE);
        assert_eq!(after, before, "compile counters before and after");
        let plan = served.plan();
        assert_eq!(plan.hosts, ["node-a", "node-b"], "no stage moved");
    });
    let log = std::fs::read_to_string(cluster.dir.join("coordinator-restarted.log")).unwrap();
    assert!(
        log.contains("adopted what the worker still serves"),
        "{log}"
    );
    assert!(!log.contains("re-planned"), "{log}");
    // The restarted coordinator (same identity, same address) reset the
    // workers' connections to its last process at their next packet: they
    // did not wait for the idle timeout.
    for w in &cluster.workers {
        let log = w.log_text();
        assert!(log.contains("reset by peer"), "{}: {log}", w.name);
    }
}

#[test]
fn a_coordinator_that_lost_a_models_bytes_serves_it_and_takes_its_weights_back_from_the_workers() {
    let mut cluster = Cluster::start_configured(
        "state-bones",
        &[("node-a", "CPU"), ("node-b", "CPU")],
        1,
        "state_dir = \"{dir}/state\"\n",
    );
    // Four 256×256 float weights (256 KiB each): each a weight the deploy
    // names by hash and the workers keep in their weight stores.
    let (inputs, want) = split(&cluster, "chain", synth::matmul_chain(4, 256, 3));
    let sha256 = tessera_common::wire::pieces::sha256_hex(
        &std::fs::read(cluster.dir.join("chain.onnx")).unwrap(),
    );
    load_split(&cluster, "chain");
    let blob = cluster.dir.join("state/blobs").join(&sha256);
    assert!(
        blob.exists(),
        "the sent model is kept as {}",
        blob.display()
    );
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let network = client.model("chain").await.unwrap().with_deadline(DEADLINE);
        let id = network.id();
        let got = network.infer(inputs.clone()).await.unwrap();
        assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE);
        let before = compiles(&cluster).await;

        // The coordinator comes back without the model's bytes (a standby
        // on a host of its own that never got a copy reads the same).
        cluster.coordinator.kill();
        std::fs::remove_file(&blob).unwrap();
        cluster.start_coordinator_again();
        let after = compiles(&cluster).await;
        let again = cluster.client().await;
        let served = again.model("chain").await.unwrap().with_deadline(DEADLINE);
        assert_eq!(served.id(), id, "the same network, adopted, not dropped");
        let got = served.infer(inputs.clone()).await.unwrap();
        assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE);
        assert_eq!(after, before, "compile counters before and after");

        // Its weights come back from the workers, the model checked
        // against its sha-256 and kept again.
        let log = cluster.dir.join("coordinator-restarted.log");
        let started = Instant::now();
        while !std::fs::read_to_string(&log)
            .unwrap()
            .contains("weights taken back from the workers")
        {
            assert!(
                started.elapsed() < DEADLINE,
                "{}",
                std::fs::read_to_string(&log).unwrap()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(blob.exists(), "the model is kept again");
        assert_eq!(
            tessera_common::wire::pieces::sha256_hex(&std::fs::read(&blob).unwrap()),
            sha256
        );

        // A re-plan needs the model: node-b is lost, and its stage moves
        // to node-a, compiled from the weights taken back.
        let b = cluster
            .workers
            .iter_mut()
            .find(|w| w.name == "node-b")
            .unwrap();
        b.kill();
        let killed = Instant::now();
        loop {
            if let Ok(now) = again.model("chain").await {
                if now.plan().hosts == ["node-a"] {
                    let got = now
                        .with_deadline(DEADLINE)
                        .infer(inputs.clone())
                        .await
                        .unwrap();
                    assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE);
                    break;
                }
            }
            assert!(
                killed.elapsed() < DEADLINE * 2,
                "not re-planned onto node-a"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        println!(
            "re-planned onto node-a {:.2} s after node-b was killed",
            killed.elapsed().as_secs_f64()
        );
    });
    let log = std::fs::read_to_string(cluster.dir.join("coordinator-restarted.log")).unwrap();
    for line in log
        .lines()
        .filter(|l| l.contains("its record") || l.contains("taken back"))
    {
        println!("{line}");
    }
    assert!(
        log.contains("restored from its record without its weights"),
        "{log}"
    );
    assert!(
        log.contains("adopted what the worker still serves"),
        "{log}"
    );
}

#[test]
fn workers_without_a_coordinator_past_their_grace_unload() {
    let mut cluster = Cluster::start_configured_with_args(
        "state-grace",
        &[
            ("node-a", "CPU", &["--adopt-grace-s", "1"]),
            ("node-b", "CPU", &["--adopt-grace-s", "1"]),
        ],
        1,
        "",
    );
    let (inputs, want) = split_cnn(&cluster);
    load_cnn(&cluster);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let network = client
            .model("cnn")
            .await
            .unwrap()
            .with_deadline(Duration::from_secs(5));
        let got = network.infer(inputs.clone()).await.unwrap();
        assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE);
        // The workers notice the loss within QUIC's idle timeout (5 s),
        // serve for their grace (1 s), then unload.
        cluster.coordinator.kill();
        let killed = Instant::now();
        let err = loop {
            match network.infer(inputs.clone()).await {
                Ok(got) => assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE),
                Err(e) => break e,
            }
            assert!(
                killed.elapsed() < DEADLINE,
                "still served after {DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let after = killed.elapsed().as_secs_f64();
        println!("served for {after:.2} s without a coordinator, then: {err}");
        assert!(after >= 1.0, "unloaded before the grace: {after:.2} s");
    });
    for w in &cluster.workers {
        let log = w.log_text();
        assert!(
            log.contains("no coordinator adopted what is deployed here in time"),
            "{}: {log}",
            w.name
        );
    }
}
