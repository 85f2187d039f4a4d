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
//!   thread, median latency ratio (target ≤ 1.05).

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
    let (mut cluster_s, mut local_s) = (Vec::new(), Vec::new());
    for _ in 0..30 {
        let t = Instant::now();
        whole.infer(inputs.to_vec()).await?;
        cluster_s.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        // Compute on this thread, as an in-process caller would.
        local.run(&local.nets[0], 1)?;
        local_s.push(t.elapsed().as_secs_f64());
    }
    let (c, l) = (median(cluster_s), median(local_s));
    println!(
        "  PP-OCRv4 det (1x3x320x320) whole on one worker process, one at a time: a cluster \
         request {:.1} ms vs onnxruntime in this process (one thread) {:.1} ms: {:.3}x \
         (median of 30, alternating)",
        c * 1e3,
        l * 1e3,
        c / l
    );
    whole.unload().await?;
    Ok(())
}
