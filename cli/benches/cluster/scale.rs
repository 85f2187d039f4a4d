//! Scaling-out figures: replicas vs one worker and vs a pipelined split,
//! `auto` against both, dynamic batching, a 64-worker embedded cluster, and
//! the scheduler over simulated clusters of up to 1,000 workers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use tessera_client::{LoadOptions, Replicas};
use tessera_common::graph::Graph;
use tessera_common::onnx::{decode_model, encode_model};
use tessera_common::schedule::simulate::simulate;
use tessera_common::synth;
use tessera_common::tensor::Tensor;

use super::{
    cluster, cpu_by_thread, cpu_since, median, model_path, rec, seeded_image, throughput,
    two_stages, Ceiling,
};

/// rec 48×320 on two single-threaded workers, 16 in flight: two replicas,
/// `auto` and two pipelined stages, each against the whole model on one
/// worker; and the machine's own ceiling (two threads over one, no
/// network) measured alternately with them.
pub async fn replicas() -> Result<()> {
    let Some((bytes, graph, inputs)) = rec()? else {
        return Ok(());
    };
    let (total, in_flight) = (96, 16);
    let (c2, client2) = cluster(2, Some(1)).await?;
    let copies = client2
        .load_network(
            bytes.clone(),
            LoadOptions::devices("CPU").replicas(Replicas::Count(2)),
        )
        .await?;
    let auto = client2
        .load_network(
            bytes.clone(),
            LoadOptions::devices("CPU").replicas(Replicas::Auto),
        )
        .await?;
    let chosen = auto.plan().replicas.len().max(1);
    for c in &auto.plan().considered {
        println!(
            "  auto weighed {} copies: {}",
            c.copies,
            c.predicted_rps
                .map_or(c.note.clone(), |r| format!("{r:.0} req/s predicted"))
        );
    }
    let (cp, pipe) = two_stages(&bytes, &graph, &inputs).await?;
    let (c1, client1) = cluster(1, Some(1)).await?;
    let one = client1
        .load_network(bytes.clone(), LoadOptions::devices("CPU"))
        .await?;
    for n in [&copies, &auto, &pipe, &one] {
        n.infer(inputs.clone()).await?;
    }
    let ceiling = Ceiling::new(&graph, &inputs)?;
    let mut rates: [Vec<f64>; 5] = Default::default();
    for _ in 0..3 {
        rates[0].push(throughput(&copies, &inputs, total, in_flight).await?);
        rates[1].push(throughput(&auto, &inputs, total, in_flight).await?);
        rates[2].push(throughput(&pipe, &inputs, total, in_flight).await?);
        rates[3].push(throughput(&one, &inputs, total, in_flight).await?);
        rates[4].push(ceiling.ratio(total / 2)?);
    }
    let [r2, ra, rp, r1, bound] = rates.map(median);
    println!(
        "replicas, PP-OCRv4 rec (1x3x48x320), {in_flight} in flight, one thread per worker \
         (median of 3, alternating):"
    );
    println!(
        "  two replicas on two workers {r2:.1} req/s, one worker {r1:.1} req/s: ratio {:.2}; \
         the ceiling (two threads over one, no network) {bound:.2}: {:.2} of it",
        r2 / r1,
        r2 / r1 / bound
    );
    println!(
        "  two pipelined stages {rp:.1} req/s (ratio {:.2}); auto ({chosen} copies) {ra:.1} req/s: \
         {:.2} of the better of replicas and pipeline",
        rp / r1,
        ra / r2.max(rp)
    );
    for n in [copies, auto, pipe, one] {
        n.unload().await?;
    }
    for c in [c2, cp, c1] {
        c.shutdown().await;
    }
    Ok(())
}

/// Dynamic batching (max_batch 8) vs off on one single-threaded worker,
/// 32 in flight: PP-OCR cls on 48×192 lines, and MiniLM-L3 on 32-token
/// sentences.
pub async fn batching() -> Result<()> {
    let cls = model_path("ch_ppocr_mobile_v2.0_cls_infer.onnx");
    let minilm = model_path("paraphrase-MiniLM-L3-v2.onnx");
    if !cls.exists() || !minilm.exists() {
        println!(
            "(skipped: {} or {} missing)",
            cls.display(),
            minilm.display()
        );
        return Ok(());
    }
    let bytes = std::fs::read(&cls)?;
    let graph = Graph::from_model(decode_model(&bytes)?)?;
    let image = seeded_image(&graph, 48, 192)?;
    batching_on("PP-OCR cls (1x3x48x192)", bytes, image).await?;
    let mut rng = synth::Rng::new(3);
    let ids: Vec<i64> = (0..32).map(|_| rng.below(1000) as i64 + 100).collect();
    let sentence = vec![
        (
            "input_ids".to_string(),
            Tensor::from_values(vec![1, 32], &ids)?,
        ),
        (
            "attention_mask".to_string(),
            Tensor::from_values(vec![1, 32], &[1i64; 32])?,
        ),
    ];
    batching_on("MiniLM-L3 (1x32 tokens)", std::fs::read(&minilm)?, sentence).await
}

async fn batching_on(label: &str, bytes: Vec<u8>, inputs: Vec<(String, Tensor)>) -> Result<()> {
    let (total, in_flight) = (640, 32);
    let (c, client) = cluster(1, Some(1)).await?;
    let off = client
        .load_network(bytes.clone(), LoadOptions::devices("CPU"))
        .await?;
    let on = client
        .load_network(
            bytes,
            LoadOptions::devices("CPU").batching(8, Duration::from_micros(500)),
        )
        .await?;
    off.infer(inputs.clone()).await?;
    on.infer(inputs.clone()).await?;
    let (mut batched, mut single) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        batched.push(throughput(&on, &inputs, total, in_flight).await?);
        single.push(throughput(&off, &inputs, total, in_flight).await?);
    }
    let (b, s) = (median(batched), median(single));
    println!(
        "batching, {label}, {in_flight} in flight, one worker, one thread: \
         max_batch 8 {b:.1} req/s, off {s:.1} req/s, ratio {:.2} (median of 3, alternating)",
        b / s
    );
    off.unload().await?;
    on.unload().await?;
    c.shutdown().await;
    Ok(())
}

/// A chain of `n` Sum nodes (its output is its input).
fn chain(n: usize) -> Vec<u8> {
    let dag = synth::Dag {
        nodes: n,
        edges: (0..n as u32 - 1).map(|i| (i, i + 1)).collect(),
    };
    encode_model(&synth::model_from_dag(&dag, None))
}

/// 64 workers in this process: registration, planning and deployment of a
/// 64-stage split and of 64 replicas, and CPU per request.
pub async fn scale64() -> Result<()> {
    const WORKERS: usize = 64;
    let started = Instant::now();
    let (c, client) = cluster(WORKERS, Some(1)).await?;
    let registered = started.elapsed();
    let deep = LoadOptions {
        devices: "CPU".into(),
        affinity: (0..WORKERS)
            .map(|i| (format!("n{i}"), format!("{}/CPU", c.workers[i])))
            .collect(),
        ..Default::default()
    };
    let t = Instant::now();
    let deep = client.load_network(chain(WORKERS), deep).await?;
    let deep_load = t.elapsed();
    let t = Instant::now();
    let small = client
        .load_network(
            encode_model(&synth::small_cnn(5)),
            LoadOptions::devices("CPU").replicas(Replicas::Count(WORKERS as u32)),
        )
        .await?;
    let replicas_load = t.elapsed();
    println!(
        "64 workers in one process: registered in {:.2} s; plan + deploy: 64-stage split {:.0} ms, \
         64 replicas {:.0} ms",
        registered.as_secs_f64(),
        deep_load.as_secs_f64() * 1e3,
        replicas_load.as_secs_f64() * 1e3
    );
    let x = vec![(
        "x".to_string(),
        Tensor::from_values(vec![4], &[1f32, 2.0, 3.0, 4.0])?,
    )];
    let graph = Graph::from_model(synth::small_cnn(5))?;
    let image = synth::random_inputs(&graph, 3).ok_or_else(|| anyhow::anyhow!("no inputs"))?;
    for (label, network, inputs, total) in [
        ("64-stage split (64 hops)", &deep, &x, 500),
        ("64 replicas of a small CNN", &small, &image, 3000),
    ] {
        network.infer(inputs.clone()).await?;
        let before = cpu_by_thread();
        let rate = throughput(network, inputs, total, 64).await?;
        let cpu_ms = cpu_since(&before) * 1e3 / total as f64;
        println!(
            "  {label}: {rate:.0} req/s with 64 in flight; {cpu_ms:.2} ms CPU per request \
             (coordinator, 64 workers' QUIC and compute, all in this process)"
        );
    }
    deep.unload().await?;
    small.unload().await?;
    c.shutdown().await;
    Ok(())
}

/// The scheduler over simulated heterogeneous clusters (seeded): planning
/// time and predicted throughput against the upper bound.
/// Returns the predicted requests/s of the 1,000-worker cluster.
pub fn simulated() -> Result<f64> {
    let graph = Arc::new(Graph::from_model(synth::small_cnn(1))?);
    println!("scheduling small_cnn with replicas = auto over simulated clusters (seed 7):");
    let mut at_1000 = 0.0;
    for workers in [64, 256, 1000] {
        let r = simulate(&graph, workers, 7, Replicas::Auto)?;
        at_1000 = r.predicted_rps;
        println!(
            "  {workers} workers ({} devices): planned in {:.0} ms, {} copies ({} split), \
             predicted {:.0} req/s, {:.2} of the upper bound ({:.0} req/s)",
            r.devices,
            r.planning_ms,
            r.copies,
            r.split_copies,
            r.predicted_rps,
            r.efficiency(),
            r.upper_bound_rps
        );
    }
    // 64 layers of 1024x1024 f32 (256 MiB, zero pages never touched),
    // every device offering about a twentieth of it.
    let chain = Graph::from_model(synth::matmul_chain_zeros(64, 1024))?;
    let r = tessera_common::schedule::simulate::simulate_with_memory(
        &chain,
        1000,
        7,
        Replicas::Auto,
        20.0,
    )?;
    let free = simulate(&chain, 1000, 7, Replicas::Auto)?;
    println!(
        "  1000 workers ({} devices), a 64-layer model needing about 20 hosts' memory: planned in \
         {:.0} ms, {} copies of up to {} stages, predicted {:.0} req/s, {:.2} of the memory-blind \
         upper bound ({:.0} req/s); without memory limits the same model plans in {:.0} ms as {} \
         copies predicting {:.0} req/s",
        r.devices,
        r.planning_ms,
        r.copies,
        r.most_stages,
        r.predicted_rps,
        r.efficiency(),
        r.upper_bound_rps,
        free.planning_ms,
        free.copies,
        free.predicted_rps
    );
    Ok(at_1000)
}
