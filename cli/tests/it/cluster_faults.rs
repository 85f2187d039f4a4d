//! Fault tolerance on a real cluster: `coordinator` and `worker` processes
//! on loopback QUIC, a steady load of requests through the client SDK, and
//! then a worker killed (SIGKILL), a worker restarted, the coordinator
//! restarted. Every answer is checked against onnxruntime on the same
//! seeded inputs (max abs diff ≤ 1e-4); no request may go unanswered.
//! (The same drill across containers is `scripts/fault-drill.sh`.)

use crate::util;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_client::{ClientError, ErrorKind, LoadOptions, Outputs};
use tessera_common::graph::Graph;
use tessera_common::onnx::{decode_model, encode_model};
use tessera_common::synth;
use tessera_common::tensor::Tensor;
use util::cluster::Cluster;
use util::oracle::{max_abs_diff, onnxruntime_many};
use util::runtime;

const TOLERANCE: f32 = 1e-4;
const DEADLINE: Duration = Duration::from_secs(30);

/// The graph's op nodes pinned to `hosts` in contiguous chunks of its
/// topological order.
fn spread(graph: &Graph, hosts: &[&str]) -> Vec<(String, String)> {
    let ops = graph.topo_ops();
    let per = ops.len().div_ceil(hosts.len());
    ops.iter()
        .enumerate()
        .map(|(i, &op)| {
            (
                graph.node(op).name.clone(),
                format!("{}/CPU", hosts[i / per]),
            )
        })
        .collect()
}

/// One answered request of the steady load.
struct Answer {
    at: Instant,
    case: usize,
    result: Result<Outputs, ClientError>,
}

#[test]
fn a_killed_worker_loses_no_request_its_networks_heal_and_it_rejoins() {
    let mut cluster = Cluster::start("faults-kill", &["node-a", "node-b", "node-c"], 1);
    let path = util::model("ch_PP-OCRv4_rec_infer.onnx");
    let bytes = std::fs::read(&path).unwrap();
    let graph = Graph::from_model(decode_model(&bytes).unwrap()).unwrap();
    let cases: Vec<Vec<(String, Tensor)>> = (0..4)
        .map(|seed| synth::random_inputs(&graph, 40 + seed).unwrap())
        .collect();
    let want = onnxruntime_many(&path, &cases, &cluster.dir.join("ort"));
    let right = |case: usize, out: &Outputs| max_abs_diff(&out.tensors[0].1, &want[case][0]);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let options = LoadOptions {
            devices: "HETERO:node-a/CPU,node-b/CPU,node-c/CPU".into(),
            affinity: spread(&graph, &["node-a", "node-b", "node-c"]),
            ..Default::default()
        };
        let network = client
            .load_network(bytes.clone(), options)
            .await
            .unwrap()
            .with_deadline(DEADLINE);
        assert_eq!(network.plan().hosts, ["node-a", "node-b", "node-c"]);
        let first = network.infer(cases[0].clone()).await.unwrap();
        assert!(right(0, &first) <= TOLERANCE);
        let before = first.deployment;
        // A network that only node-b can run: nothing remains for it.
        let pinned = client
            .load_network(bytes.clone(), LoadOptions::devices("HETERO:node-b/CPU"))
            .await
            .unwrap()
            .with_deadline(DEADLINE);

        // A steady load: four lanes, one request after another.
        let stop = Arc::new(AtomicBool::new(false));
        let lanes: Vec<_> = (0..4)
            .map(|lane| {
                let (network, cases, stop) = (network.clone(), cases.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut answers = Vec::new();
                    let mut k = lane;
                    while !stop.load(Ordering::Relaxed) {
                        let case = k % cases.len();
                        k += 4;
                        let result = network.infer(cases[case].clone()).await;
                        answers.push(Answer {
                            at: Instant::now(),
                            case,
                            result,
                        });
                    }
                    answers
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let killed = Instant::now();
        cluster.workers[1].kill();

        // The pinned network fails, naming the worker, well before its
        // deadline.
        let err = pinned.infer(cases[0].clone()).await.unwrap_err();
        println!("network pinned to node-b: {err}");
        assert_eq!(err.kind(), ErrorKind::WorkerLost, "{err}");
        let err = err.to_string();
        assert!(err.contains("node-b"), "{err}");
        assert!(killed.elapsed() < DEADLINE / 2);

        tokio::time::sleep(Duration::from_secs(6)).await;
        stop.store(true, Ordering::Relaxed);
        let mut answers = Vec::new();
        for lane in lanes {
            // Every request is answered: none lost.
            let lane = tokio::time::timeout(DEADLINE + Duration::from_secs(10), lane)
                .await
                .expect("a lane's request was never answered")
                .unwrap();
            answers.extend(lane);
        }
        let (mut ok, mut retried) = (0, 0);
        let mut recovered: Option<Duration> = None;
        for a in &answers {
            let out = match &a.result {
                Ok(out) => out,
                Err(e) => panic!("request of case {} failed: {e}", a.case),
            };
            let diff = right(a.case, out);
            assert!(diff <= TOLERANCE, "case {}: max abs diff {diff}", a.case);
            ok += 1;
            if out.attempts > 1 {
                retried += 1;
            }
            if out.deployment != before && a.at > killed {
                let took = a.at - killed;
                recovered = Some(recovered.map_or(took, |r| r.min(took)));
            }
        }
        let recovered = recovered.expect("requests succeeded on the re-planned network");
        println!(
            "node-b killed under load: {} requests, {ok} succeeded ({retried} retried), 0 failed, 0 lost; \
             first success on the new plan {:.2} s after the kill",
            answers.len(),
            recovered.as_secs_f64()
        );
        assert!(retried >= 1, "requests in flight on node-b were retried");
        let healed = network.infer(cases[1].clone()).await.unwrap();
        assert!(!healed.counters.transfers.iter().any(|t| t.from == "node-b" || t.to == "node-b"));

        // node-b comes back: it registers again, the broken network heals
        // onto it, and new plans use it.
        let (restarted, _) = cluster.worker("node-b", &cluster.certs.clone(), 1);
        cluster.workers[1] = restarted;
        let back = Instant::now();
        let result = loop {
            match pinned.infer(cases[2].clone()).await {
                Ok(out) => break out,
                Err(_) if back.elapsed() < Duration::from_secs(20) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("the network pinned to node-b did not heal: {e}"),
            }
        };
        assert!(right(2, &result) <= TOLERANCE);
        let workers: Vec<String> = client
            .cluster()
            .await
            .unwrap()
            .workers
            .into_iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(workers, ["node-a", "node-b", "node-c"]);
        println!(
            "node-b rejoined: the pinned network answered again {:.2} s after the restart",
            back.elapsed().as_secs_f64()
        );
        assert!(cluster.coordinator.running());
    });
}

/// The model, its seeded inputs, onnxruntime's answers, the load options.
type SmallCnnCase = (
    tessera_common::onnx::proto::ModelProto,
    Vec<(String, Tensor)>,
    Vec<Vec<Tensor>>,
    LoadOptions,
);

/// The small CNN split over node-a and node-b: the model, seeded inputs,
/// onnxruntime's answers to them, and the load options.
fn small_cnn_on_two(cluster: &Cluster, seed: u64) -> SmallCnnCase {
    let model = synth::small_cnn(7);
    let path = cluster.dir.join("small_cnn.onnx");
    std::fs::write(&path, encode_model(&model)).unwrap();
    let graph = Graph::from_model(model.clone()).unwrap();
    let inputs = synth::random_inputs(&graph, seed).unwrap();
    let want = onnxruntime_many(
        &path,
        std::slice::from_ref(&inputs),
        &cluster.dir.join("ort"),
    );
    let options = LoadOptions {
        devices: "HETERO:node-a/CPU,node-b/CPU".into(),
        affinity: spread(&graph, &["node-a", "node-b"]),
        ..Default::default()
    };
    (model, inputs, want, options)
}

#[test]
fn a_restarted_coordinator_gets_its_workers_back_and_clients_reload() {
    let mut cluster = Cluster::start("faults-restart", &["node-a", "node-b"], 1);
    let (model, inputs, want, options) = small_cnn_on_two(&cluster, 3);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let network = client
            .load_network(encode_model(&model), options.clone())
            .await
            .unwrap()
            .with_deadline(DEADLINE);
        network.infer(inputs.clone()).await.unwrap();

        cluster.restart_coordinator();
        let restarted = Instant::now();
        // The workers register again by themselves; a new session reloads.
        let client = loop {
            let client = cluster.client().await;
            let workers = client.cluster().await.unwrap().workers.len();
            if workers == 2 {
                break client;
            }
            assert!(
                restarted.elapsed() < Duration::from_secs(30),
                "workers did not come back: {workers} registered"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        // Their new sessions dropped what the old coordinator deployed,
        // and the new one does not know the network: a clear error, not a
        // hang.
        let err = network.infer(inputs.clone()).await.unwrap_err();
        println!("request on the old network: {err}");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::NotFound | ErrorKind::Unavailable | ErrorKind::WorkerLost
            ),
            "{err}"
        );
        assert!(
            restarted.elapsed() < DEADLINE,
            "it failed within its deadline"
        );
        println!(
            "coordinator restarted: both workers registered again within {:.2} s",
            restarted.elapsed().as_secs_f64()
        );
        let network = client
            .load_network(encode_model(&model), options)
            .await
            .unwrap();
        let got = network.infer(inputs.clone()).await.unwrap();
        assert!(max_abs_diff(&got.tensors[0].1, &want[0][0]) <= TOLERANCE);
    });
}

#[test]
fn a_worker_stopped_with_sigterm_drains_and_no_request_is_retried() {
    let mut cluster = Cluster::start("faults-sigterm", &["node-a", "node-b"], 1);
    let (model, inputs, want, options) = small_cnn_on_two(&cluster, 5);
    let node_b = cluster.workers[1].pid() as libc::pid_t;
    let rt = runtime();
    let answered = rt.block_on(async {
        let client = cluster.client().await;
        let network = client
            .load_network(encode_model(&model), options)
            .await
            .unwrap()
            .with_deadline(DEADLINE);
        let first = network.infer(inputs.clone()).await.unwrap();
        // Four requesters in a loop while node-b is stopped: SIGTERM makes
        // it drain (the coordinator moves its half onto node-a while node-b
        // serves what it holds), so none of them fails or is retried.
        let done = AtomicBool::new(false);
        let requester = || async {
            let mut seen = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let got = network
                    .infer(inputs.clone())
                    .await
                    .expect("no request fails");
                assert!(max_abs_diff(&got.tensors[0].1, &want[0][0]) <= TOLERANCE);
                seen.push((got.deployment, got.attempts));
            }
            seen
        };
        let stopper = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            // SAFETY: kill(2) on our own child's pid; no memory is touched.
            unsafe { libc::kill(node_b, libc::SIGTERM) };
            tokio::time::sleep(Duration::from_secs(4)).await;
            done.store(true, Ordering::Relaxed);
        };
        let (answered, ()) = tokio::join!(
            futures_util::future::join_all((0..4).map(|_| requester())),
            stopper
        );
        let answered: Vec<(u64, u32)> = answered.into_iter().flatten().collect();
        let moved = answered
            .iter()
            .filter(|(d, _)| *d != first.deployment)
            .count();
        let retried = answered.iter().filter(|(_, a)| *a > 1).count();
        println!(
            "SIGTERM under load: {} answered, {moved} by the new deployment, {retried} retried",
            answered.len()
        );
        assert!(moved > 0, "the network moved off node-b");
        assert_eq!(retried, 0, "a drain retries nothing");
        answered
    });
    assert!(!answered.is_empty());
    let status = cluster.workers[1].terminate();
    assert!(
        status.is_some_and(|s| s.success()),
        "node-b's exit: {status:?}"
    );
    let worker_log = cluster.workers[1].log_text();
    assert!(worker_log.contains("drained"), "{worker_log}");
    let log = cluster.coordinator.log_text();
    for said in [
        "worker draining",
        "network moved off draining worker node-b",
        "worker left after draining",
    ] {
        assert!(
            log.contains(said),
            "'{said}' in the coordinator's log:\n{log}"
        );
    }
    assert!(
        !log.lines()
            .any(|l| l.contains("worker lost") && l.contains("node-b")),
        "a drained worker is not lost:\n{log}"
    );
}
