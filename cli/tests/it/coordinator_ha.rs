//! Two coordinators on a real etcd (`[ha]`), real processes: the standby
//! takes over when the leader is killed with SIGKILL while a tritonclient
//! loop of 300 requests runs through a worker's front door (every answer
//! checked against onnxruntime), and a new `tessera load` lands on it
//! within seconds; a leader paused past its lease (SIGSTOP) steps down
//! when it resumes and changes nothing; a coordinator on an empty state
//! folder (a pod rescheduled without its volume) leads, adopts what the
//! workers serve from the records' bones and takes the weights back from
//! them, 0 requests failing; a bad etcd address, etcd down at start and
//! etcd lost while leading each give one clear error.

use crate::util;

use std::time::{Duration, Instant};

use tessera_common::graph::Graph;
use tessera_common::onnx::encode_model;
use tessera_common::synth;
use tessera_common::tensor::Tensor;
use tessera_common::wire::control::CompileCounts;
use util::cluster::{certs_init, CLUSTER};
use util::ha::{wait_log, HaCluster};
use util::kserve::{free_port, python, split_models_config};
use util::oracle::{max_abs_diff, onnxruntime_many};
use util::{runtime, tessera};

const TOLERANCE: f32 = 1e-4;
const DEADLINE: Duration = Duration::from_secs(30);

/// A small CNN written to `cnn.onnx` in `dir`, its inputs and
/// onnxruntime's outputs.
fn cnn(dir: &std::path::Path) -> (Vec<(String, Tensor)>, Vec<Tensor>) {
    let model = synth::small_cnn(11);
    std::fs::write(dir.join("cnn.onnx"), encode_model(&model)).unwrap();
    let graph = Graph::from_model(model).unwrap();
    let inputs = synth::random_inputs(&graph, 5).unwrap();
    let want = onnxruntime_many(
        &dir.join("cnn.onnx"),
        std::slice::from_ref(&inputs),
        &dir.join("ort"),
    );
    (inputs, want[0].clone())
}

/// `tessera load NAME cnn.onnx` on node-a, through every coordinator:
/// whether it succeeded, and what it printed.
fn load_cnn(cluster: &HaCluster, name: &str) -> (bool, String) {
    let model = cluster.dir.join("cnn.onnx").display().to_string();
    let mut args: Vec<String> = ["load", name, &model, "--devices", "HETERO:node-a/CPU"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(cluster.client_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = tessera(&args);
    (ok, format!("{out}{err}"))
}

/// `tessera cluster` through every coordinator.
fn cluster_text(cluster: &HaCluster) -> String {
    let mut args = vec!["cluster".to_string()];
    args.extend(cluster.client_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = tessera(&args);
    assert!(ok, "tessera cluster: {out}{err}");
    out
}

/// Each worker's compile counters, as the leader reports them, once every
/// worker has reported compiling (or loading from its cache) something.
async fn compiles(cluster: &HaCluster) -> Vec<(String, CompileCounts)> {
    let client = cluster.client().await;
    let started = Instant::now();
    loop {
        let state = client.cluster().await.unwrap();
        let reported = |c: &CompileCounts| c.compiled + c.cache_loads > 0;
        if state.workers.iter().all(|w| reported(&w.compiles)) {
            return state
                .workers
                .into_iter()
                .map(|w| (w.name, w.compiles))
                .collect();
        }
        assert!(started.elapsed() < DEADLINE, "no compile counts reported");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_standby_takes_over_from_a_killed_leader_under_load() {
    let listen = format!("127.0.0.1:{}", free_port());
    let door: &[&str] = &["--http-listen", &listen];
    let mut cluster = HaCluster::start(
        "takeover",
        &[("node-a", door), ("node-b", &[])],
        &split_models_config(),
    );
    python("kserve_test.py", &listen, &["--phase", "serving"]);
    cnn(&cluster.dir);
    let rt = runtime();
    let before = rt.block_on(compiles(&cluster));
    let looping = {
        let listen = listen.clone();
        std::thread::spawn(move || {
            python(
                "kserve_test.py",
                &listen,
                &["--phase", "loop", "--requests", "300"],
            )
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let killed = Instant::now();
    cluster.coordinators[0].kill();
    // A new load goes to the standby once it leads.
    let (ok, out) = load_cnn(&cluster, "cnn");
    let took = killed.elapsed().as_secs_f64();
    assert!(ok, "tessera load after the leader's kill: {out}");
    println!("a new load succeeded {took:.2} s after the leader's kill -9 (load included)");
    let standby = &cluster.coordinators[1];
    let log = standby.log_text();
    let led = log.lines().find(|l| l.contains("leading the cluster"));
    println!("the standby: {}", led.unwrap_or("(no line)"));
    looping
        .join()
        .expect("all 300 requests through the worker's front door succeeded");
    // The standby adopted what the workers ran: nothing moved, nothing
    // was compiled again but the new model's one subgraph.
    assert!(
        log.contains("adopted what the worker still serves"),
        "{log}"
    );
    assert!(!log.contains("re-planned"), "{log}");
    let after = rt.block_on(compiles(&cluster));
    for ((name, b), (_, a)) in before.iter().zip(&after) {
        assert!(
            a.compiled <= b.compiled + 1,
            "{name}: {b:?} before, {a:?} after"
        );
    }
    let text = cluster_text(&cluster);
    let (a, b) = (cluster.addrs[0], cluster.addrs[1]);
    assert!(
        text.contains(&format!("coordinator {b} (leader)")),
        "{text}"
    );
    assert!(!text.contains(&a.to_string()), "{text}");
    python("kserve_test.py", &listen, &["--phase", "serving"]);
}

#[test]
fn a_coordinator_on_an_empty_volume_serves_from_the_bones_and_takes_the_weights_back() {
    let mut cluster = HaCluster::start("bones", &[("node-a", &[]), ("node-b", &[])], "");
    // A chain of four 256×256 float weights, split over both workers: each
    // weight a piece the workers keep by hash.
    let model = synth::matmul_chain(4, 256, 9);
    let file = cluster.dir.join("chain.onnx");
    std::fs::write(&file, encode_model(&model)).unwrap();
    let graph = Graph::from_model(model).unwrap();
    let ops = graph.topo_ops();
    let affinity: std::collections::BTreeMap<String, String> = ops
        .iter()
        .enumerate()
        .map(|(i, &op)| {
            let host = if i < ops.len() / 2 {
                "node-a"
            } else {
                "node-b"
            };
            (graph.node(op).name.clone(), format!("{host}/CPU"))
        })
        .collect();
    let affinity_file = cluster.dir.join("affinity.json");
    std::fs::write(&affinity_file, serde_json::to_string(&affinity).unwrap()).unwrap();
    let inputs = synth::random_inputs(&graph, 5).unwrap();
    let want = onnxruntime_many(
        &file,
        std::slice::from_ref(&inputs),
        &cluster.dir.join("ort"),
    );
    let mut args: Vec<String> = [
        "load",
        "chain",
        &file.display().to_string(),
        "--devices",
        "HETERO:node-a/CPU,node-b/CPU",
        "--affinity",
        &affinity_file.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(cluster.client_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = tessera(&args);
    assert!(ok, "tessera load: {out}{err}");

    let rt = runtime();
    let network = rt.block_on(async {
        let client = cluster.client().await;
        client.model("chain").await.unwrap().with_deadline(DEADLINE)
    });
    let looping = {
        let (inputs, want) = (inputs.clone(), want[0].clone());
        std::thread::spawn(move || {
            runtime().block_on(async {
                for i in 0..150 {
                    let got = network.infer(inputs.clone()).await;
                    let got = got.unwrap_or_else(|e| panic!("request {i}: {e}"));
                    assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE);
                    tokio::time::sleep(Duration::from_millis(40)).await;
                }
            })
        })
    };
    // Both coordinators go; one comes back on an empty state folder: what
    // it knows is etcd's records, the model's bytes are nowhere.
    std::thread::sleep(Duration::from_millis(500));
    cluster.coordinators[1].kill();
    cluster.coordinators[0].kill();
    std::fs::remove_dir_all(cluster.dir.join("state-b")).unwrap();
    let back = cluster.start_coordinator("b");
    assert!(
        wait_log(&back, "weights taken back from the workers", DEADLINE),
        "{}",
        back.log_text()
    );
    looping
        .join()
        .expect("all 150 requests answered, as onnxruntime does");
    let log = back.log_text();
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
    assert!(!log.contains("re-planned"), "{log}");
    // Kept again in its own folder.
    let sha256 = tessera_common::wire::pieces::sha256_hex(&std::fs::read(&file).unwrap());
    let blob = cluster.dir.join("state-b/blobs").join(&sha256);
    let started = Instant::now();
    while !blob.exists() {
        assert!(
            started.elapsed() < DEADLINE,
            "{} not kept again",
            blob.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster.coordinators[1] = back;
}

#[test]
fn a_paused_leader_changes_nothing_when_it_resumes() {
    let mut cluster = HaCluster::start("fencing", &[("node-a", &[])], "");
    let (inputs, want) = cnn(&cluster.dir);
    let (ok, out) = load_cnn(&cluster, "cnn");
    assert!(ok, "{out}");
    let rt = runtime();
    let before = rt.block_on(compiles(&cluster));
    cluster.coordinators[0].pause();
    let b = cluster.addrs[1];
    assert!(
        wait_log(&cluster.coordinators[1], "leading the cluster", DEADLINE),
        "{}",
        cluster.coordinators[1].log_text()
    );
    assert!(
        wait_log(&cluster.workers[0], &format!("coordinator={b}"), DEADLINE),
        "{}",
        cluster.workers[0].log_text()
    );
    cluster.coordinators[0].resume();
    // The old leader finds its lease gone, says so once, and stops.
    let resumed = Instant::now();
    while cluster.coordinators[0].running() {
        assert!(resumed.elapsed() < DEADLINE, "the old leader still runs");
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = cluster.coordinators[0].log_text();
    assert_eq!(log.matches("stepping down").count(), 1, "{log}");
    println!(
        "the resumed leader stepped down in {:.2} s",
        resumed.elapsed().as_secs_f64()
    );
    rt.block_on(async {
        let network = cluster.client().await.model("cnn").await.unwrap();
        let got = network.with_deadline(DEADLINE).infer(inputs).await.unwrap();
        assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE);
    });
    assert_eq!(rt.block_on(compiles(&cluster)), before);
    let worker = cluster.workers[0].log_text();
    assert!(!worker.contains("unloading"), "{worker}");
}

/// A coordinator with `[ha]` `etcd` that cannot start: its exit status
/// and log.
fn failed_start(dir: &std::path::Path, name: &str, etcd: &str) -> (bool, String) {
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "cluster = \"{CLUSTER}\"\nlisten = \"127.0.0.1:0\"\ncerts = \"{}\"\n\
             state_dir = \"{}\"\n[ha]\netcd = [\"{etcd}\"]\n",
            dir.join("certs").display(),
            dir.join("state").display()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_coordinator"))
        .args(["--config", &config.display().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < DEADLINE, "{name}: still running");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    use std::io::Read;
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    println!(
        "{name}: {:.2} s: {}",
        started.elapsed().as_secs_f64(),
        err.trim()
    );
    (status.success(), err)
}

#[test]
fn a_bad_etcd_etcd_down_and_etcd_lost_each_give_one_clear_error() {
    let dir = util::Scratch::new("ha-bad-etcd");
    certs_init(&dir.join("certs"), CLUSTER, &["coordinator", "client"]);
    let (ok, err) = failed_start(&dir, "bad-address", "htp:/nowhere");
    assert!(
        !ok && err.contains("ha.etcd endpoint 'htp:/nowhere'"),
        "{err}"
    );
    let down = format!("http://127.0.0.1:{}", free_port());
    let (ok, err) = failed_start(&dir, "down", &down);
    assert!(
        !ok && err.contains(&format!("etcd at {down} cannot be reached")),
        "{err}"
    );

    // Lost while leading: both coordinators step down (once each), the
    // worker and the requester that has the routing table go on.
    let mut cluster = HaCluster::start("etcd-lost", &[("node-a", &[])], "");
    let (inputs, want) = cnn(&cluster.dir);
    let (ok, out) = load_cnn(&cluster, "cnn");
    assert!(ok, "{out}");
    let rt = runtime();
    rt.block_on(async {
        let network = cluster.client().await.model("cnn").await.unwrap();
        let network = network.with_deadline(DEADLINE);
        cluster.etcd.kill();
        for c in &mut cluster.coordinators {
            let lost = Instant::now();
            while c.running() {
                assert!(lost.elapsed() < DEADLINE, "{} still runs", c.name);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let log = c.log_text();
            assert_eq!(log.matches("stepping down").count(), 1, "{log}");
        }
        let got = network.infer(inputs).await.unwrap();
        assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= TOLERANCE);
    });
}
