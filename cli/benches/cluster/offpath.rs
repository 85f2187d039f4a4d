//! The coordinator off the data path (`offpath`), on real processes: a
//! coordinator and two single-threaded worker processes, the requester
//! (the SDK) in this process.
//! - PP-OCRv4 rec with two replicas, 1,000 requests with 16 in flight:
//!   each process's CPU seconds per 1,000 requests (from /proc), the
//!   coordinator's as a share of the workers' (target ≤ 1%), and the
//!   coordinator's CPU over as long a time with no requests at all (its
//!   heartbeats: what it spends whatever the load);
//! - PP-OCRv4 det whole on one worker, one request at a time: a cluster
//!   request (requester → worker → requester over QUIC) vs the same model
//!   run in this process through the same onnxruntime backend with one
//!   thread, median latency ratio (target ≤ 1.05);
//! - with `simulate`: a `tessera serve` gateway's CPU per KServe v2
//!   request and the coordinator's per heartbeat, scaled to the simulated
//!   1,000-worker cluster's predicted rate ([`costs_at_scale`]).

use std::time::Instant;

use anyhow::{Context, Result};
use tessera_client::{LoadOptions, Replicas};

use super::util::cluster::Cluster;
use super::{det, median, rec, throughput, Ceiling};

/// CPU seconds process `pid` has used so far (every thread, user and
/// system).
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("a /proc stat line")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks: f64 = [11, 12]
        .iter()
        .map(|&i| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        })
        .sum();
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks / hz)
}

fn cpu_of(pids: &[u32]) -> Result<Vec<f64>> {
    pids.iter().map(|&p| cpu_seconds(p)).collect()
}

pub async fn offpath() -> Result<()> {
    let Some((rec_bytes, _, rec_inputs)) = rec()? else {
        return Ok(());
    };
    let Some((det_bytes, det_graph, det_inputs)) = det()? else {
        return Ok(());
    };
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::start_logged(
            "bench-offpath",
            &[("node-a", "CPU"), ("node-b", "CPU")],
            1,
            "",
            "warn",
        )
    })
    .await?;
    let client = cluster.client().await;
    let copies = client
        .load_network(
            rec_bytes,
            LoadOptions::devices("CPU").replicas(Replicas::Count(2)),
        )
        .await?;
    throughput(&copies, &rec_inputs, 32, 16).await?;
    let mut pids = vec![cluster.coordinator.pid()];
    pids.extend(cluster.workers.iter().map(|w| w.pid()));
    pids.push(std::process::id());
    let total = 1000;
    let before = cpu_of(&pids)?;
    let started = Instant::now();
    let rate = throughput(&copies, &rec_inputs, total, 16).await?;
    let wall = started.elapsed();
    let after = cpu_of(&pids)?;
    let used: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let idle_before = cpu_seconds(pids[0])?;
    tokio::time::sleep(wall).await;
    let idle = cpu_seconds(pids[0])? - idle_before;
    let per_1000 = |s: f64| s * 1000.0 / total as f64;
    let workers: f64 = used[1..3].iter().sum();
    println!(
        "coordinator off the data path: PP-OCRv4 rec (1x3x48x320), two replicas on two \
         single-threaded worker processes, {total} requests, 16 in flight, {rate:.1} req/s"
    );
    println!(
        "  CPU s per 1,000 requests: coordinator {:.3}, workers {:.2} ({:.2} + {:.2}), the \
         requester (SDK) {:.2}; the coordinator's share of the workers' {:.2}%; over as long \
         with no requests it used {:.3} s",
        per_1000(used[0]),
        per_1000(workers),
        per_1000(used[1]),
        per_1000(used[2]),
        per_1000(used[3]),
        100.0 * used[0] / workers.max(1e-9),
        idle
    );
    copies.unload().await?;
    det_vs_in_process(&client, det_bytes, &det_graph, &det_inputs).await?;
    drop(client);
    drop(cluster);
    Ok(())
}

/// det whole on one worker, one request at a time, vs the same model in
/// this process (the CPU plugin's onnxruntime backend, one thread).
async fn det_vs_in_process(
    client: &tessera_client::Client,
    bytes: Vec<u8>,
    graph: &tessera_common::graph::Graph,
    inputs: &[(String, tessera_common::tensor::Tensor)],
) -> Result<()> {
    let whole = client
        .load_network(bytes, LoadOptions::devices("HETERO:node-a/CPU"))
        .await?;
    let local = Ceiling::new(graph, inputs)?;
    for _ in 0..3 {
        whole.infer(inputs.to_vec()).await?;
    }
    let (mut cluster_s, mut local_s, mut run_s) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..30 {
        let t = Instant::now();
        let outputs = whole.infer(inputs.to_vec()).await?;
        cluster_s.push(t.elapsed().as_secs_f64());
        run_s.push(outputs.subgraphs.iter().map(|(_, d)| d.as_secs_f64()).sum());
        let t = Instant::now();
        // Compute on this thread, as an in-process caller would.
        local.run(&local.nets[0], 1)?;
        local_s.push(t.elapsed().as_secs_f64());
    }
    let (c, l, r) = (median(cluster_s), median(local_s), median(run_s));
    println!(
        "  PP-OCRv4 det (1x3x320x320) whole on one worker process, one at a time: a cluster \
         request {:.1} ms vs onnxruntime in this process (one thread) {:.1} ms: {:.3}x \
         (median of 30, alternating); the worker's run {:.1} ms, {:.2} ms outside it",
        c * 1e3,
        l * 1e3,
        c / l,
        r * 1e3,
        (c - r) * 1e3
    );
    whole.unload().await?;
    Ok(())
}

/// Heartbeats of the simulated workers, as the coordinator's default
/// `heartbeat_ms` (500) sends them: per worker per second.
const HEARTBEATS_PER_S: f64 = 2.0;
/// The test cluster's heartbeat period (the tests' `heartbeat_ms`).
const TEST_HEARTBEAT_S: f64 = 0.2;
/// How long the coordinator's idle CPU is measured at least.
const IDLE_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// What one request costs the processes that are not workers, measured on
/// real processes, and what that means for a cluster of `workers` workers
/// the scheduler predicts `rps` requests/s for: a `tessera serve` gateway's
/// CPU per KServe v2 request (small CNN, binary tensors, 16 in flight),
/// and the coordinator's CPU while those run and while nothing does
/// (heartbeats, per heartbeat).
pub async fn costs_at_scale(workers: usize, rps: f64) -> Result<()> {
    let model = tessera_common::onnx::encode_model(&tessera_common::synth::small_cnn(1));
    let graph = tessera_common::graph::Graph::from_model(tessera_common::synth::small_cnn(1))?;
    let inputs = super::seeded_image(&graph, 64, 64)?;
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::start_logged(
            "bench-costs",
            &[("node-a", "CPU"), ("node-b", "CPU")],
            1,
            "",
            "warn",
        )
    })
    .await?;
    let client = cluster.client().await;
    let network = client
        .load_model(
            "cnn",
            model,
            LoadOptions::devices("CPU").replicas(Replicas::Count(2)),
            |_, _, _| {},
        )
        .await?;
    let listen = format!("127.0.0.1:{}", super::util::kserve::free_port());
    let mut args = vec!["serve".to_string()];
    args.extend(cluster.client_args());
    args.extend(["--http-listen".to_string(), listen.clone()]);
    let dir = cluster.dir.to_path_buf();
    let (gateway, _) = tokio::task::spawn_blocking(move || {
        super::util::cluster::Proc::start(
            "gateway",
            env!("CARGO_BIN_EXE_tessera"),
            &args,
            &dir,
            "serving HTTP on ",
            "warn",
        )
    })
    .await?;
    let (name, x) = &inputs[0];
    let (head, body) = super::http::binary_request(name, x);
    let url = format!("http://{listen}/v2/models/cnn/infer");
    let web = reqwest::Client::builder()
        .pool_max_idle_per_host(32)
        .build()?;
    let want = network.infer(inputs.clone()).await?;
    let reply = super::http::http_infer(&web, &url, &head, &body).await?;
    anyhow::ensure!(
        reply.ends_with(want.tensors[0].1.bytes()),
        "the gateway's answer differs from the SDK's"
    );
    let total = 10_000;
    let pids = [cluster.coordinator.pid(), gateway.pid()];
    let before = cpu_of(&pids)?;
    let started = Instant::now();
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(16));
    let mut tasks = Vec::new();
    for _ in 0..total {
        let permit = gate.clone().acquire_owned().await?;
        let (web, url, head, body) = (web.clone(), url.clone(), head.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let r = super::http::http_infer(&web, &url, &head, &body).await;
            drop(permit);
            r
        }));
    }
    for t in tasks {
        t.await??;
    }
    let wall = started.elapsed();
    let used: Vec<f64> = cpu_of(&pids)?
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    // Long enough for /proc's clock ticks (10 ms) to resolve it.
    let quiet = IDLE_WINDOW.max(wall);
    let idle_from = cpu_seconds(pids[0])?;
    tokio::time::sleep(quiet).await;
    let idle = cpu_seconds(pids[0])? - idle_from;
    let per_request = used[1] / total as f64;
    let heartbeats = 2.0 * quiet.as_secs_f64() / TEST_HEARTBEAT_S;
    let per_heartbeat = idle / heartbeats;
    let coordinator_cores = workers as f64 * HEARTBEATS_PER_S * per_heartbeat;
    let door_cores = rps * per_request;
    println!(
        "  measured on real processes (small CNN as a named model, two replicas, KServe v2 \
         binary requests, 16 in flight, {:.0} req/s): a `tessera serve` gateway {:.0} µs of CPU \
         per request; the coordinator {:.3} s over the run ({:.1} s) and {:.3} s over {:.0} s \
         with no requests ({:.0} µs per heartbeat, all its idle work counted)",
        total as f64 / wall.as_secs_f64(),
        per_request * 1e6,
        used[0],
        wall.as_secs_f64(),
        idle,
        quiet.as_secs_f64(),
        per_heartbeat * 1e6,
    );
    println!(
        "  so at {workers} workers and {rps:.0} req/s: front doors need {door_cores:.1} cores \
         (one core serves {:.0} req/s; any worker or gateway runs one, so they scale out with \
         the cluster), the coordinator {coordinator_cores:.2} cores for heartbeats every 500 ms \
         whatever the request rate: the workers and front doors bound the cluster, the \
         coordinator does not",
        1.0 / per_request.max(1e-12),
    );
    drop(gateway);
    network.unload().await?;
    drop(client);
    drop(cluster);
    Ok(())
}
