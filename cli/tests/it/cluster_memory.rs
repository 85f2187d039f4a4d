//! Models bigger than one machine: a seeded chain of 2048×2048 f32 layers
//! (16 MiB each) on workers whose memory is limited, split into stages that
//! each fit, checked against onnxruntime on the same input (the same
//! kernels run on the same weights: differences stay below 1e-4); refused
//! with one clear error when the cluster cannot hold it; the split follows
//! memory and measured speed; a restarted worker's stage comes from its
//! compile cache, not over the network.

use crate::util;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tessera_cli::cluster::{run_system, start_workers, WorkerSpec};
use tessera_client::{Client, LoadOptions, Plan};
use tessera_common::synth::{matmul_chain, Rng};
use tessera_common::tensor::Tensor;
use tessera_worker::daemon::config::MemoryLimits;
use util::cluster::Cluster;
use util::oracle::{max_abs_diff, onnxruntime};
use util::runtime;

const MIB: u64 = 1 << 20;
const TOLERANCE: f32 = 1e-4;

/// The chain written to `dir`: its path and bytes.
fn chain(dir: &Path, layers: usize) -> (PathBuf, Vec<u8>) {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(format!("chain{layers}.onnx"));
    let bytes = tessera_common::onnx::encode_model(&matmul_chain(layers, 2048, 7));
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

fn input(batch: usize, seed: u64) -> Vec<(String, Tensor)> {
    let mut rng = Rng::new(seed);
    let values: Vec<f32> = (0..batch * 2048)
        .map(|_| rng.below(2000) as f32 / 1000.0 - 1.0)
        .collect();
    vec![(
        "x".into(),
        Tensor::from_values(vec![batch, 2048], &values).unwrap(),
    )]
}

/// Layers (MatMul nodes) per subgraph, with the subgraph's worker.
fn layers(plan: &Plan) -> Vec<(String, usize)> {
    plan.subgraphs
        .iter()
        .map(|s| {
            let host = s.device.split('/').next().unwrap_or_default().to_string();
            (host, s.nodes.iter().filter(|n| n.starts_with("mm")).count())
        })
        .collect()
}

/// Runs the chain on `network` and compares it with onnxruntime; returns
/// the deployment that answered.
async fn check(network: &tessera_client::Network, path: &Path, dir: &Path, batch: usize) -> u64 {
    let inputs = input(batch, 11);
    let want = onnxruntime(path, &inputs, dir);
    let got = network.infer(inputs).await.unwrap();
    let diff = max_abs_diff(&got.tensors[0].1, &want[0]);
    assert!(diff <= TOLERANCE, "max abs diff vs onnxruntime {diff:e}");
    got.deployment
}

fn in_use(state: &tessera_client::ClusterState, worker: &str) -> u64 {
    state
        .workers
        .iter()
        .find(|w| w.name == worker)
        .map_or(0, |w| w.memory_in_use.iter().map(|(_, b)| b).sum())
}

/// The clusters here are planned on measured speeds and links: one at a
/// time, so that one test's processes do not skew another's figures (run
/// together on two loaded cores, a worker measured while another test
/// compiled could be planned a different cut, and a healed network miss
/// its cached stage).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn a_model_bigger_than_each_worker_runs_in_stages_that_fit_and_heals_from_the_cache() {
    let _one = one_at_a_time();
    let limit: &[&str] = &["--memory-limit", "64MiB"];
    let names = ["node-a", "node-b", "node-c"];
    let workers: Vec<(&str, &str, &[&str])> = names.iter().map(|n| (*n, "CPU", limit)).collect();
    let mut cluster = Cluster::start_with_args("memory", &workers, 1);
    let (path, bytes) = chain(&cluster.dir, 8);
    let (ok, out, err) =
        util::tessera(&[&["cluster"][..], &to_refs(&cluster.client_args())].concat());
    assert!(ok, "{err}");
    assert_eq!(
        out.matches("memory 64.0 MiB, 0 B in use").count(),
        3,
        "{out}"
    );
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let mut shipped = Vec::new();
        let network = client
            .load_network_with_progress(
                bytes.clone(),
                LoadOptions::devices("CPU"),
                |what, done, total| {
                    if what.starts_with("sending subgraph") && done == total {
                        shipped.push(total);
                    }
                },
            )
            .await
            .unwrap();
        let plan = network.plan().clone();
        let split = layers(&plan);
        assert_eq!(split.len(), 3, "{split:?}");
        assert_eq!(split.iter().map(|(_, n)| n).sum::<usize>(), 8);
        assert!(split.iter().all(|(_, n)| *n <= 3), "{split:?}");
        assert!(plan.subgraphs.iter().all(|s| s.memory.total() <= 64 * MIB));
        assert!(plan.memory.pipelined.is_some());
        // Every stage crossed the network once, its weights in it.
        assert_eq!(shipped.len(), 3, "{shipped:?}");
        assert!(shipped.iter().sum::<u64>() > 128 * MIB);
        let first = check(&network, &path, &cluster.dir.join("ort"), 1).await;
        let state = client.cluster().await.unwrap();
        let used: u64 = names.iter().map(|n| in_use(&state, n)).sum();
        assert!((128 * MIB..=129 * MIB).contains(&used), "{used}");
        // What the first copy holds is taken: a second does not fit.
        let err = client
            .load_network(bytes.clone(), LoadOptions::devices("CPU"))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("does not fit the devices' memory"), "{err}");
        // node-c dies: two workers cannot hold the model; it comes back
        // and its stage comes from its compile cache.
        cluster.workers[2].kill();
        let (restarted, _) = restart(&cluster, "node-c", limit);
        cluster.workers[2] = restarted;
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let outcome = network.infer(input(1, 11)).await;
            eprintln!(
                "after the restart: {:?}",
                outcome.as_ref().map(|o| o.deployment)
            );
            match outcome {
                Ok(out) if out.deployment != first => break,
                _ if Instant::now() > until => panic!("the network did not heal"),
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        check(&network, &path, &cluster.dir.join("ort2"), 1).await;
    });
    let log = cluster.workers[2].log_text();
    // Planned as it was: its speed read back, not measured again.
    assert!(log.contains("CPU speed as measured before"), "{log}");
    assert!(log.contains("cached=true"), "{log}");
    assert!(!log.contains("received the subgraph's model"), "{log}");
}

/// Starts worker `name` again with the cluster's arguments and `extra`.
fn restart(cluster: &Cluster, name: &str, extra: &[&str]) -> (util::cluster::Proc, String) {
    let mut args = cluster.worker_args(name, &cluster.certs, 1);
    args.extend(extra.iter().map(|a| a.to_string()));
    util::cluster::Proc::start(
        &format!("{name}-restarted"),
        env!("CARGO_BIN_EXE_worker"),
        &args,
        &cluster.dir,
        "registered as ",
        "info",
    )
}

fn to_refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Embedded workers, one spec each: memory limit and threads.
fn specs(workers: &[(&str, usize)]) -> Vec<WorkerSpec> {
    workers
        .iter()
        .map(|(limit, threads)| WorkerSpec {
            memory_limit: limit.parse::<MemoryLimits>().unwrap(),
            ..WorkerSpec::new(
                &["CPU".to_string()],
                &[("NUM_THREADS".to_string(), threads.to_string())],
            )
        })
        .collect()
}

async fn client_of(cluster: &tessera_cli::cluster::Embedded) -> Client {
    Client::connect(cluster.addr, &cluster.client, tessera_cli::cluster::CLUSTER)
        .await
        .unwrap()
}

#[test]
fn a_cluster_too_small_refuses_the_model_and_deploys_nothing() {
    let _one = one_at_a_time();
    let dir = util::Scratch::new("memory-small");
    let (_, bytes) = chain(&dir, 8);
    run_system(async move {
        let cluster =
            start_workers(&specs(&[("32MiB", 1), ("32MiB", 1), ("32MiB", 1)]), |_| {}).await?;
        let client = client_of(&cluster).await;
        let err = client
            .load_network(bytes, LoadOptions::devices("CPU"))
            .await
            .err()
            .unwrap();
        let text = err.to_string();
        for part in [
            "needs 128.0 MiB",
            "offer 96.0 MiB",
            "node-a/CPU 32.0 MiB",
            "largest single need is 16.0 MiB",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        let state = client.cluster().await?;
        assert_eq!(state.networks, 0);
        assert!(state
            .workers
            .iter()
            .all(|w| w.memory_in_use.iter().all(|(_, b)| *b == 0)));
        cluster.shutdown().await;
        Ok(())
    })
    .unwrap();
}

#[test]
fn memory_and_measured_speed_decide_the_split() {
    let _one = one_at_a_time();
    let dir = util::Scratch::new("memory-split");
    let (six, six_bytes) = chain(&dir, 6);
    let (_, eight_bytes) = chain(&dir, 8);
    run_system(async move {
        // 96 MiB holds at most 5 layers and 48 MiB 2 (each also holds its
        // activations): the 6-layer chain goes 4:2.
        let cluster = start_workers(&specs(&[("96MiB", 1), ("48MiB", 1)]), |_| {}).await?;
        let client = client_of(&cluster).await;
        let network = client
            .load_network(six_bytes, LoadOptions::devices("CPU"))
            .await?;
        let split = layers(network.plan());
        assert_eq!(
            split,
            [("node-a".to_string(), 4), ("node-b".to_string(), 2)]
        );
        check(&network, &six, &dir.join("ort"), 1).await;
        cluster.shutdown().await;

        // Equal memory (6 layers at most each at this batch); node-b
        // computes with two threads and is measured twice as fast. At a
        // batch of 256 the layers are compute-bound (2 GFLOP each, 2 MiB
        // moved between stages), and node-b gets more of them.
        let cluster = start_workers(&specs(&[("112MiB", 1), ("112MiB", 2)]), |_| {}).await?;
        let client = client_of(&cluster).await;
        let state = client.cluster().await?;
        let gflops: BTreeMap<String, f64> = state
            .workers
            .iter()
            .map(|w| (w.name.clone(), w.devices[0].gflops))
            .collect();
        assert!(gflops["node-b"] > 1.9 * gflops["node-a"], "{gflops:?}");
        let options = LoadOptions {
            shapes: vec![("x".into(), vec![256, 2048])],
            ..LoadOptions::devices("CPU")
        };
        let plan = client.plan(eight_bytes, options).await?;
        let split: BTreeMap<String, usize> = layers(&plan).into_iter().collect();
        let stages = plan.memory.pipelined.as_ref().map(|p| &p.stages);
        assert!(
            split["node-b"] > split["node-a"],
            "{split:?} {gflops:?}: {stages:#?}"
        );
        assert_eq!(split.values().sum::<usize>(), 8);
        cluster.shutdown().await;
        Ok(())
    })
    .unwrap();
}

#[test]
fn bad_memory_limits_are_clear_errors() {
    let worker = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_worker"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = worker(&["--coordinator", "127.0.0.1:9", "--memory-limit", "0"]);
    assert!(err.contains("a memory limit of 0 leaves no room"), "{err}");
    let err = worker(&["--coordinator", "127.0.0.1:9", "--memory-limit", "lots"]);
    assert!(err.contains("'lots' is not a size"), "{err}");
    let dir = util::Scratch::new("memory-bad");
    let config = dir.join("worker.toml");
    std::fs::write(
        &config,
        "coordinator = \"127.0.0.1:9\"\nmemory_limit = \"CPU=2 parsecs\"\n",
    )
    .unwrap();
    let err = worker(&["--config", config.to_str().unwrap()]);
    assert!(
        err.contains("memory_limit") && err.contains("is not a size"),
        "{err}"
    );
    let (ok, _, err) = util::tessera(&["plan", "x.onnx", "--worker-memory", "0MiB"]);
    assert!(!ok && err.contains("a memory limit of 0"), "{err}");
}

#[test]
fn a_worker_that_offers_memory_it_does_not_have_is_left_out() {
    let _one = one_at_a_time();
    let limit: &[&str] = &["--memory-limit", "1GiB"];
    let mut cluster = Cluster::start_with_args(
        "memory-lie",
        &[("node-a", "CPU", limit), ("node-b", "CPU", limit)],
        1,
    );
    // node-a says 1 GiB, but may map only 32 MiB more than it has now.
    let pid = cluster.workers[0].pid();
    let room = util::status_bytes(pid, "VmSize:").unwrap() + 32 * MIB;
    let cap = libc::rlimit {
        rlim_cur: room,
        rlim_max: room,
    };
    // SAFETY: prlimit(2) on our own child process with a valid struct.
    let set = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_AS,
            &cap,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());
    let (path, bytes) = chain(&cluster.dir, 8);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        // Priority puts the whole model on node-a, which cannot take it:
        // the load is planned again without it.
        let options = LoadOptions::devices("HETERO:node-a/CPU,node-b/CPU");
        let network = client.load_network(bytes, options).await.unwrap();
        assert_eq!(network.plan().hosts, ["node-b"]);
        check(&network, &path, &cluster.dir.join("ort"), 1).await;
        let state = client.cluster().await.unwrap();
        assert!(
            state.workers.iter().any(|w| w.name == "node-a"),
            "node-a is still up"
        );
    });
    assert!(cluster.workers[0].running(), "node-a failed cleanly");
    let log = cluster.coordinator.log_text();
    assert!(
        log.contains("worker node-a could not take its subgraph"),
        "{log}"
    );
    assert!(log.contains("out of memory"), "{log}");
}

/// The bytes each "received the subgraph's model" line of `log` says came.
fn received(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("received the subgraph's model"))
        .filter_map(|l| l.split("received=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn workers_that_can_read_a_named_model_from_their_own_disk_are_sent_only_its_frames() {
    let _one = one_at_a_time();
    // The model repository, mounted where the workers may read models.
    let models = util::Scratch::new("memory-own-disk-models");
    let (path, _) = chain(&models, 8);
    let models_dir = models.display().to_string();
    let args: &[&str] = &["--memory-limit", "64MiB", "--models-dir", &models_dir];
    let names = ["node-a", "node-b", "node-c"];
    let workers: Vec<(&str, &str, &[&str])> = names.iter().map(|n| (*n, "CPU", args)).collect();
    let table = format!(
        "[models.chain]\npath = {:?}\ndevices = \"CPU\"\n",
        path.display().to_string()
    );
    let cluster = Cluster::start_configured_with_args("memory-own-disk", &workers, 1, &table);
    runtime().block_on(async {
        let client = cluster.client().await;
        let deadline = Instant::now() + Duration::from_secs(120);
        let network = loop {
            match client.model("chain").await {
                Ok(n) => break n,
                Err(e) if Instant::now() > deadline => panic!("chain did not load: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let split = layers(network.plan());
        assert_eq!(split.len(), 3, "{split:?}");
        check(&network, &path, &cluster.dir.join("ort"), 2).await;
    });
    // 128 MiB of weights, each stage's read from the worker's own disk:
    // what crossed the network is the frames between them.
    for w in &cluster.workers {
        let log = w.log_text();
        assert!(log.contains("weights from this worker's disk"), "{log}");
        let got = received(&log);
        assert!(!got.is_empty(), "{log}");
        assert!(
            got.iter().all(|&b| b < 64 << 10),
            "{}: received {got:?}",
            w.name
        );
    }
}
