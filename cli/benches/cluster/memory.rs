//! Models bigger than one machine:
//! - `memory`: the 128 MiB chain (8 layers of 2048×2048 f32) pipelined over
//!   two single-threaded workers offering 80 MiB each (4:4) vs one worker
//!   holding it all, 8 in flight, against the machine's no-network ceiling
//!   (the whole model on two threads vs one);
//! - `rss`: peak resident memory of real `coordinator` and `worker`
//!   processes while the chain (128 MiB, and 512 MiB) loads split over two
//!   workers, against the model file, each worker's stage weights and what
//!   onnxruntime alone needs for a session of that stage; then the same
//!   for SmolLM2-135M (538 MB), the language model of `generate`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use tessera_cli::cluster::{start_workers, WorkerSpec};
use tessera_client::{Client, LoadOptions};
use tessera_common::graph::Graph;
use tessera_common::memory::format_size;
use tessera_common::onnx::encode_model;
use tessera_common::synth::{matmul_chain, Rng};
use tessera_common::tensor::Tensor;
use tessera_worker::daemon::config::MemoryLimits;

use super::{median, throughput, Ceiling};

#[path = "../../tests/it/util/mod.rs"]
mod util;

fn chain_input(batch: usize) -> Result<Vec<(String, Tensor)>> {
    let mut rng = Rng::new(5);
    let values: Vec<f32> = (0..batch * 2048)
        .map(|_| rng.below(2000) as f32 / 1000.0 - 1.0)
        .collect();
    Ok(vec![(
        "x".into(),
        Tensor::from_values(vec![batch, 2048], &values)?,
    )])
}

/// A single-threaded CPU worker offering `limit` (else what it has).
pub(super) fn spec(limit: Option<&str>) -> Result<WorkerSpec> {
    Ok(WorkerSpec {
        memory_limit: match limit {
            Some(l) => l.parse::<MemoryLimits>()?,
            None => MemoryLimits::default(),
        },
        ..WorkerSpec::new(
            &["CPU".to_string()],
            &[("NUM_THREADS".to_string(), "1".to_string())],
        )
    })
}

async fn connect(c: &tessera_cli::cluster::Embedded) -> Result<Client> {
    Ok(Client::connect(c.addr, &c.client, tessera_cli::cluster::CLUSTER).await?)
}

/// The 128 MiB chain over two workers of 80 MiB vs one worker, 8 in
/// flight, median of 3 alternating, with the no-network ceiling.
pub async fn pipeline() -> Result<()> {
    let model = matmul_chain(8, 2048, 7);
    let bytes = encode_model(&model);
    let graph = Graph::from_model(model)?;
    let inputs = chain_input(1)?;
    let two_workers = start_workers(&[spec(Some("80MiB"))?, spec(Some("80MiB"))?], |_| {}).await?;
    let one_worker = start_workers(&[spec(None)?], |_| {}).await?;
    let client2 = connect(&two_workers).await?;
    let client1 = connect(&one_worker).await?;
    let split = client2
        .load_network(bytes.clone(), LoadOptions::devices("CPU"))
        .await?;
    let whole = client1
        .load_network(bytes, LoadOptions::devices("CPU"))
        .await?;
    let stages: Vec<String> = split
        .plan()
        .subgraphs
        .iter()
        .map(|s| format!("{} {}", s.device, format_size(s.memory.total())))
        .collect();
    println!(
        "the 128 MiB chain (8 layers of 2048x2048 f32, batch 1) on two workers offering 80 MiB each: {}",
        stages.join(", ")
    );
    split.infer(inputs.clone()).await?;
    whole.infer(inputs.clone()).await?;
    let ceiling = Ceiling::new(&graph, &inputs)?;
    let (total, in_flight) = (64, 8);
    let (mut t2, mut t1, mut bound) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        t2.push(throughput(&split, &inputs, total, in_flight).await?);
        t1.push(throughput(&whole, &inputs, total, in_flight).await?);
        bound.push(ceiling.ratio(total / 2)?);
    }
    let (t2, t1, bound) = (median(t2), median(t1), median(bound));
    println!(
        "  {in_flight} in flight, one thread per worker: split {t2:.1} req/s, one worker holding it \
         all {t1:.1} req/s: {:.2}x; the no-network ceiling (two threads vs one) {bound:.2}x, so \
         {:.2} of it (median of 3, alternating)",
        t2 / t1,
        t2 / t1 / bound
    );
    split.unload().await?;
    whole.unload().await?;
    two_workers.shutdown().await;
    one_worker.shutdown().await;
    Ok(())
}

/// A `/proc/PID/status` figure in bytes.
fn status_bytes(pid: u32, key: &str) -> Result<u64> {
    util::status_bytes(pid, key).with_context(|| format!("no {key} for process {pid}"))
}

/// The increase of peak RSS over resident memory before, of onnxruntime
/// alone (Python, the same 1.32 library, one thread, default
/// optimizations) building a session for `model`.
fn onnxruntime_session(model: &Path) -> Result<u64> {
    let script = "import sys, onnxruntime as ort\n\
        def kb(k):\n    return int([l for l in open('/proc/self/status') if l.startswith(k)][0].split()[1])\n\
        before = kb('VmRSS:')\n\
        o = ort.SessionOptions(); o.intra_op_num_threads = 1\n\
        s = ort.InferenceSession(sys.argv[1], o, providers=['CPUExecutionProvider'])\n\
        print((kb('VmHWM:') - before) * 1024)\n";
    let out = Command::new("python3")
        .args(["-c", script, &model.display().to_string()])
        .output()
        .context("python3 with onnxruntime")?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// Peak RSS of real processes while a chain of `layers` loads over two
/// workers whose limits split it in halves.
async fn rss_of(layers: usize, dir: &Path) -> Result<()> {
    let bytes = encode_model(&matmul_chain(layers, 2048, 7));
    let file = bytes.len() as u64;
    let path = dir.join(format!("chain{layers}.onnx"));
    std::fs::write(&path, &bytes)?;
    // Half the layers and a little room for activations.
    let limit = format!("{}MiB", layers as u64 * 8 + 4);
    let stage_path = dir.join(format!("chain{}.onnx", layers / 2));
    std::fs::write(
        &stage_path,
        encode_model(&matmul_chain(layers / 2, 2048, 7)),
    )?;
    let session = onnxruntime_session(&stage_path)?;
    let flags: &[&str] = &["--memory-limit", &limit];
    let cluster = util::cluster::Cluster::start_with_args(
        &format!("rss{layers}"),
        &[("node-a", "CPU", flags), ("node-b", "CPU", flags)],
        1,
    );
    let (pids, before) = residents(&cluster)?;
    let client = cluster.client().await;
    let started = Instant::now();
    let network = client
        .load_network(std::fs::read(&path)?, LoadOptions::devices("CPU"))
        .await?;
    let loaded = started.elapsed().as_secs_f64();
    network.infer(chain_input(1)?).await?;
    let stage_weights = stage_weights(&network);
    println!(
        "{} chain ({layers} layers) over two worker processes offering {limit} each, loaded in \
         {loaded:.2} s ({:.0} MB/s); stages hold {:?}; onnxruntime alone builds a session for one \
         stage at +{}:",
        format_size(file),
        file as f64 / loaded / 1e6,
        stage_weights
            .iter()
            .map(|&w| format_size(w))
            .collect::<Vec<_>>(),
        format_size(session)
    );
    print_peaks(&pids, &before, file, &stage_weights, |_| session)?;
    network.unload().await?;
    Ok(())
}

/// Each process's resident memory before, at its peak and once loaded: the
/// coordinator's growth against the model's `file` size, each worker's
/// (less what onnxruntime alone needs for its stage's session, `session`
/// of the stage's weights) against its stage's weights.
fn print_peaks(
    pids: &[(String, u32)],
    before: &[u64],
    file: u64,
    stage_weights: &[u64],
    session: impl Fn(u64) -> u64,
) -> Result<()> {
    for (((name, pid), start), i) in pids.iter().zip(before).zip(0..) {
        let peak = status_bytes(*pid, "VmHWM:")?;
        let now = status_bytes(*pid, "VmRSS:")?;
        let grew = peak.saturating_sub(*start);
        let against = if i == 0 {
            format!(
                "{:.2}x the model file (target <= 1.3)",
                grew as f64 / file as f64
            )
        } else {
            let w = stage_weights.get(i - 1).copied().unwrap_or(0);
            format!(
                "(peak - onnxruntime's session) / stage weights {:.2} (target <= 1.3)",
                grew.saturating_sub(session(w)) as f64 / w.max(1) as f64
            )
        };
        println!(
            "  {name}: resident {} before, peak {} (+{}), {} once loaded (+{}): {against}",
            format_size(*start),
            format_size(peak),
            format_size(grew),
            format_size(now),
            format_size(now.saturating_sub(*start))
        );
    }
    Ok(())
}

/// The weights each stage of `network` holds.
fn stage_weights(network: &tessera_client::Network) -> Vec<u64> {
    network
        .plan()
        .subgraphs
        .iter()
        .map(|s| s.memory.weights)
        .collect()
}

/// Each process's name and pid.
type Pids = Vec<(String, u32)>;

/// The processes' pids and resident memory now.
fn residents(cluster: &util::cluster::Cluster) -> Result<(Pids, Vec<u64>)> {
    let pids: Vec<(String, u32)> = std::iter::once(&cluster.coordinator)
        .chain(&cluster.workers)
        .map(|p| (p.name.clone(), p.pid()))
        .collect();
    let before = pids
        .iter()
        .map(|(_, pid)| status_bytes(*pid, "VmRSS:"))
        .collect::<Result<_>>()?;
    Ok((pids, before))
}

/// Peak RSS while SmolLM2-135M (538 MB of float32 weights, the language
/// model of `generate`) loads split over two worker processes. onnxruntime
/// alone is measured for the whole model, and each stage's share taken in
/// proportion to its weights (an estimate: no stage file exists here).
async fn rss_of_llm() -> Result<()> {
    let dir = super::model_path("smollm2-135m-instruct");
    let file = std::fs::metadata(dir.join("model.onnx"))?.len()
        + std::fs::metadata(dir.join("model.onnx.data"))?.len();
    let whole_session = onnxruntime_session(&dir.join("model.onnx"))?;
    let flags: &[&str] = &["--memory-limit", "400MiB"];
    let cluster = util::cluster::Cluster::start_with_args(
        "rss-llm",
        &[("node-a", "CPU", flags), ("node-b", "CPU", flags)],
        1,
    );
    let (pids, before) = residents(&cluster)?;
    let client = cluster.client().await;
    let mut folder = tessera_client::generate::ModelFolder::read(&dir, 1)?;
    folder.generation.context_length = 512;
    let options = LoadOptions {
        devices: "CPU".into(),
        generation: Some(folder.generation),
        ..Default::default()
    };
    let started = Instant::now();
    let network = client.load_network(folder.model, options).await?;
    let loaded = started.elapsed().as_secs_f64();
    let stage_weights = stage_weights(&network);
    let total: u64 = stage_weights.iter().sum();
    println!(
        "SmolLM2-135M ({}) over two worker processes offering 400MiB each, loaded in {loaded:.2} s; \
         stages hold {:?}; onnxruntime alone builds a session for the whole model at +{}:",
        format_size(file),
        stage_weights.iter().map(|&w| format_size(w)).collect::<Vec<_>>(),
        format_size(whole_session)
    );
    let share = |w: u64| (whole_session as f64 * w as f64 / total.max(1) as f64) as u64;
    print_peaks(&pids, &before, file, &stage_weights, share)?;
    network.unload().await?;
    Ok(())
}

/// Peak RSS of real processes while the 128 MiB and the 512 MiB chains
/// load split over two workers.
pub async fn rss() -> Result<()> {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("tessera-bench-rss-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    for layers in [8, 32] {
        rss_of(layers, &dir).await?;
    }
    rss_of_llm().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
