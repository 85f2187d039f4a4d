//! Distributed figures (a figure printer, not a timed test):
//! `cargo bench -p tessera-cli --bench cluster [-- streaming|hop|rtt|split|pipeline|quic|pipe2|backends|http|offpath|replicas|batching|scale|simulate|memory|rss|generate|embeddings]`.
//!
//! Each figure is a ratio of two runs made in this one process, alternating
//! where it matters, so noise on a shared machine hits both alike:
//! - streaming: tensors between two QUIC nodes (Tessera's data-plane link,
//!   on QUIC and through shared memory) vs plain TCP on loopback, 1 MB and
//!   64 MB tensors (target ≥ 0.8);
//! - hop: one tensor at a time over an idle link, as a request's tensors
//!   go, 4 KB to 4 MB: median latency on QUIC and through shared memory
//!   (same-host peers), and TCP's time over each;
//! - rtt: a small request's round trip through an embedded cluster
//!   (client → worker → client: the coordinator is off the data path),
//!   p50/p99;
//! - split: PP-OCRv4 rec on a 48×320 line (the size rapidocr feeds it)
//!   split in halves over two workers vs the same split in one process
//!   (HETERO), median latency ratio (target ≤ 1.10), with the share of
//!   compute and of everything else and each tensor moved; the halves
//!   balance the per-node times the CPU plugin measures;
//! - pipeline: rec, then det, split into two balanced stages on two
//!   workers with one thread each vs one worker with one thread running
//!   it whole, throughput with 16 requests in flight (target ≥ 1.7); and
//!   its ceiling on this machine: the whole model on two threads vs one in
//!   one process, no network;
//! - quic (only when named): one link streaming 1 MB tensors for a while,
//!   to profile the transport alone;
//! - pipe2 (only when named): rec's two pipelined stages alone for a
//!   while, to profile what the pipelined run spends beyond compute;
//! - backends: rec's two pipelined stages on the two-worker cluster with
//!   the onnxruntime CPU backend vs the same with tract, throughput with 16
//!   in flight (median of 3, alternating);
//! - http: rec's two pipelined stages as a named model, served over HTTP
//!   (KServe v2 binary tensors, 16 requests in flight on keep-alive
//!   connections) and over gRPC (raw tensors, one HTTP/2 connection) vs
//!   the Rust SDK on the same cluster (targets: HTTP ≥ 0.9, gRPC ≥ 0.95;
//!   median of 3, alternating);
//! - offpath: real coordinator and worker processes: each one's CPU per
//!   1,000 rec requests on two replicas (the coordinator's share of the
//!   workers', target ≤ 1%), and a det request through the cluster vs
//!   onnxruntime in this process, one thread (target ≤ 1.05);
//! - replicas: rec on two single-threaded workers, 16 in flight: two
//!   replicas, `auto` and two pipelined stages vs the whole model on one
//!   worker, with the machine's no-network ceiling (target: replicas ≥ 0.9
//!   of the ceiling, `auto` ≥ 0.95 of the better of the other two);
//! - batching: PP-OCR cls 48×192, 32 in flight, max_batch 8 vs off;
//! - scale: 64 workers in this process: registration, plan + deploy of a
//!   64-stage split and of 64 replicas, throughput and CPU per request;
//! - simulate: the scheduler over 64, 256 and 1,000 simulated workers, and
//!   over 1,000 with a model that needs about 20 hosts' memory; then what
//!   a request costs a front door (a `tessera serve` process) and a
//!   heartbeat the coordinator, measured, at the 1,000 workers' rate;
//! - memory: a 128 MiB chain of layers pipelined over two workers that
//!   each offer 80 MiB vs one worker holding it all, 8 in flight, against
//!   the no-network ceiling;
//! - rss: peak resident memory of real coordinator and worker processes
//!   while a 128 MiB and a 512 MiB model load split over two workers;
//! - generate: text generation (see `generate.rs`);
//! - embeddings: MiniLM sentence embeddings over HTTP `/v1/embeddings` on
//!   one single-threaded worker vs onnxruntime in one process on one
//!   thread, batches of 1 and 32.
//!
//! The CPU device is the default backend (onnxruntime where it loads) in
//! every figure but `backends`, in the cluster and in-process alike.
//!
//! `TESSERA_BENCH_CPU=1` also prints the CPU time per request (per MB for
//! streaming) by kind of thread: subgraph compute threads and the rest
//! (QUIC, routing). The bench tunes the allocator as the binaries do
//! (`tessera_cli::tune_allocator`); `TESSERA_BENCH_MALLOC=default` leaves
//! glibc's defaults, to compare.
//!
//! The embedded cluster is a coordinator and workers in this process
//! talking QUIC with mutual TLS on loopback.

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tessera_client::{Client, LoadOptions, Network};
use tessera_common::affinity::{DeviceId, DevicePriority, Policy};
use tessera_common::graph::Graph;
use tessera_common::onnx::{decode_model, encode_model, ElemType};
use tessera_common::partition::Algorithm;
use tessera_common::synth;
use tessera_common::tensor::Tensor;
use tessera_common::wire::handshake::Role;
use tessera_common::wire::peer::PeerMessage;
use tessera_common::wire::Frame;
use tessera_net::{certs, serve_streams, Link, Node};
use tessera_worker::hetero;
use tessera_worker::plugin::{Config, DevicePlugin};
use tessera_worker::plugins::{self, CpuBackend, PluginOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use anyhow::{Context, Result};

mod embed;
mod generate;
mod http;
mod memory;
mod offpath;
mod scale;
// The tests' real-process cluster (a coordinator and worker processes).
#[allow(clippy::duplicate_mod)]
#[path = "../../tests/it/util/mod.rs"]
mod util;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn model_path(name: &str) -> PathBuf {
    std::env::var_os("TESSERA_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/models")))
        .join(name)
}

fn main() -> Result<()> {
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |name: &str| wanted.is_empty() || wanted.iter().any(|w| w == name);
    let quic_only = wanted.iter().any(|w| w == "quic");
    let pipe_only = wanted.iter().any(|w| w == "pipe2");
    // As the binaries run (glibc keeps freed memory; see the function);
    // TESSERA_BENCH_MALLOC=default leaves glibc as it is, to compare.
    if std::env::var("TESSERA_BENCH_MALLOC").as_deref() != Ok("default") {
        tessera_cli::tune_allocator();
    }
    tessera_cli::cluster::run_system(async move {
        if run("streaming") {
            streaming().await?;
        }
        if quic_only {
            // The QUIC link alone, long enough to profile.
            let gbps = quic_throughput(1 << 20, 4096, false).await?;
            println!("QUIC link, 1 MB tensors: {gbps:.2} GB/s");
        }
        if pipe_only {
            // The two-worker pipeline alone, long enough to profile.
            pipelined_alone().await?;
        }
        if run("hop") {
            hop().await?;
        }
        if run("rtt") {
            rtt().await?;
        }
        if run("split") {
            split().await?;
        }
        if run("pipeline") {
            pipeline().await?;
        }
        if run("backends") {
            backends().await?;
        }
        if run("http") {
            http::http_vs_sdk().await?;
        }
        if run("offpath") {
            offpath::offpath().await?;
        }
        if run("replicas") {
            scale::replicas().await?;
        }
        if run("batching") {
            scale::batching().await?;
        }
        if run("scale") {
            scale::scale64().await?;
        }
        if run("simulate") {
            let rps = scale::simulated()?;
            offpath::costs_at_scale(1000, rps).await?;
        }
        if run("memory") {
            memory::pipeline().await?;
        }
        if run("rss") {
            memory::rss().await?;
        }
        if run("generate") {
            generate::generation().await?;
        }
        if run("embeddings") {
            embed::embeddings().await?;
        }
        Ok(())
    })
}

/// Two nodes on loopback, a link from the first to the second, and the
/// sizes of the tensors the second receives; large payloads through
/// shared memory or all on QUIC (`shared`).
async fn quic_pair(
    shared: bool,
) -> Result<(
    Node,
    Node,
    Link,
    tokio::sync::mpsc::UnboundedReceiver<usize>,
)> {
    let ids = certs::ephemeral("bench", &["a", "b"])?;
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let a = Node::bind(any, &ids[0], "bench", Role::Worker)?;
    let a = if shared { a } else { a.without_shared_memory() };
    let b = Node::bind(any, &ids[1], "bench", Role::Worker)?;
    let addr = b.local_addr()?;
    let (accepted, dialed) = tokio::join!(b.accept(&[Role::Worker]), a.dial(addr));
    let (peer_b, peer_a) = (accepted.context("no connection")??, dialed?);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
    tokio::spawn(serve_streams(
        peer_b.connection.clone(),
        *b.limits(),
        move |f: Frame<PeerMessage>, _| {
            let tx = tx.clone();
            async move {
                if let Frame::Tensor(_, payload) = f {
                    let _ = tx.send(payload.len());
                }
            }
        },
    ));
    let link = Link::open(peer_a.connection.clone(), "b", *a.limits(), 8);
    Ok((a, b, link, rx))
}

/// GB/s sending `count` tensors of `size` bytes over a Tessera link (on
/// QUIC, or through shared memory: `shared`).
async fn quic_throughput(size: usize, count: usize, shared: bool) -> Result<f64> {
    let (a, b, link, mut rx) = quic_pair(shared).await?;
    let tensor = Tensor::new(ElemType::UINT8, vec![size], vec![1u8; size])?;
    let cpu_before = cpu_by_thread();
    let started = Instant::now();
    let sending = async {
        for i in 0..count {
            link.send_tensor(1, i as u64, "t", &tensor).await?;
        }
        Ok::<(), anyhow::Error>(())
    };
    let receiving = async {
        let mut got = 0;
        while got < size * count {
            got += rx.recv().await.context("receiver closed")?;
        }
        Ok::<(), anyhow::Error>(())
    };
    let (s, r) = tokio::join!(sending, receiving);
    s?;
    r?;
    let secs = started.elapsed().as_secs_f64();
    if std::env::var_os("TESSERA_BENCH_CPU").is_some() {
        let used = cpu_since(&cpu_before);
        println!(
            "    {} {} B x {count}: {:.2} ms CPU per MB",
            if shared { "shared" } else { "QUIC" },
            size,
            used * 1e3 / (size * count) as f64 * 1e6
        );
    }
    a.shutdown().await;
    b.shutdown().await;
    Ok((size * count) as f64 / secs / 1e9)
}

/// GB/s for the same over plain TCP: a 16-byte header, then the bytes.
async fn tcp_throughput(size: usize, count: usize) -> Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let receiver = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let mut head = [0u8; 16];
        for _ in 0..count {
            s.read_exact(&mut head).await?;
            let mut buf = vec![0u8; size];
            s.read_exact(&mut buf).await?;
        }
        Ok::<(), std::io::Error>(())
    });
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let payload = vec![1u8; size];
    let started = Instant::now();
    for _ in 0..count {
        s.write_all(&[0u8; 16]).await?;
        s.write_all(&payload).await?;
    }
    s.flush().await?;
    receiver.await??;
    Ok((size * count) as f64 / started.elapsed().as_secs_f64() / 1e9)
}

async fn streaming() -> Result<()> {
    println!("streaming between two nodes on loopback (median of 3, alternating)");
    println!(
        "{:<10} {:>10} {:>12} {:>10} {:>10} {:>12}",
        "tensor", "QUIC GB/s", "shared GB/s", "TCP GB/s", "QUIC/TCP", "shared/TCP"
    );
    for (size, count) in [(1 << 20, 256), (64 << 20, 6)] {
        let (mut q, mut m, mut t) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            q.push(quic_throughput(size, count, false).await?);
            m.push(quic_throughput(size, count, true).await?);
            t.push(tcp_throughput(size, count).await?);
        }
        let (q, m, t) = (median(q), median(m), median(t));
        println!(
            "{:<10} {q:>10.2} {m:>12.2} {t:>10.2} {:>10.2} {:>12.2}",
            format!("{} MB", size >> 20),
            q / t,
            m / t
        );
    }
    Ok(())
}

async fn cluster(
    workers: usize,
    threads: Option<usize>,
) -> Result<(tessera_cli::cluster::Embedded, Client)> {
    let config: Vec<(String, String)> = threads
        .map(|t| vec![("NUM_THREADS".to_string(), t.to_string())])
        .unwrap_or_default();
    let c = tessera_cli::cluster::start(workers, &["CPU".to_string()], &config).await?;
    let client = Client::connect(c.addr, &c.client, tessera_cli::cluster::CLUSTER).await?;
    Ok((c, client))
}

async fn rtt() -> Result<()> {
    let (c, client) = cluster(1, Some(1)).await?;
    let dag = synth::Dag {
        nodes: 1,
        edges: vec![],
    };
    let model = synth::model_from_dag(&dag, None);
    let network = client
        .load_network(encode_model(&model), LoadOptions::default())
        .await?;
    let x = Tensor::from_values(vec![4], &[1f32, 2.0, 3.0, 4.0])?;
    let mut times = Vec::new();
    let cpu_before = cpu_by_thread();
    for i in 0..520 {
        let t = Instant::now();
        network.infer(vec![("x".into(), x.clone())]).await?;
        if i >= 20 {
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let cpu = cpu_since(&cpu_before);
    println!(
        "small request round trip (client → worker → back, 500 requests): p50 {:.0} µs, p99 {:.0} µs; \
         {:.0} µs of CPU per request (all threads)",
        percentile(times.clone(), 0.5),
        percentile(times, 0.99),
        cpu * 1e6 / 520.0
    );
    network.unload().await?;
    c.shutdown().await;
    Ok(())
}

/// The two stages of a model: (node, in the first stage?), cut in
/// topological order where the per-node times measured by the CPU plugin's
/// counters (one process, one thread) split evenly (within 3% of the most
/// even cut), and among such cuts the one that fewest tensors cross: on
/// rec two cuts a node apart balance alike, one crossing with one 0.9 MB
/// tensor, the other with two, and the timing noise picked either.
fn halves(graph: &Graph, inputs: &[(String, Tensor)]) -> Result<Vec<(String, bool)>> {
    let plugins: Vec<(DeviceId, Arc<dyn DevicePlugin>)> =
        vec![(DeviceId::parse("CPU")?, plugins::create("CPU")?)];
    let mut config = Config::default();
    config.set("PERF_COUNT", "YES")?;
    let whole = hetero::Network::load(
        graph.model().clone(),
        &plugins,
        &hetero::LoadOptions {
            priority: DevicePriority::parse("HETERO:CPU")?,
            policy: Policy::Priority,
            algorithm: Algorithm::Fast,
            strict: true,
            manual: BTreeMap::new(),
            config,
            shapes: Default::default(),
        },
    )?;
    let feeds: HashMap<String, Tensor> = inputs.iter().cloned().collect();
    let mut per_node: HashMap<String, f64> = HashMap::new();
    for _ in 0..5 {
        for (_, _, counters) in whole.run(&feeds)?.subgraphs {
            for c in counters {
                *per_node.entry(c.node).or_default() += c.real_us as f64;
            }
        }
    }
    let ops = graph.topo_ops();
    let times: Vec<f64> = ops
        .iter()
        .map(|&op| per_node.get(&graph.node(op).name).copied().unwrap_or(0.0))
        .collect();
    let total: f64 = times.iter().sum();
    // Each cut (the first stage's node count): how unevenly it splits the
    // time, and how many computed tensors cross it.
    let at: HashMap<_, usize> = ops.iter().enumerate().map(|(k, &op)| (op, k)).collect();
    let mut cuts = Vec::with_capacity(ops.len());
    let mut acc = 0.0;
    for (k, t) in times.iter().enumerate() {
        acc += t;
        let cut = k + 1;
        let crossing = ops[..cut]
            .iter()
            .filter(|&&op| graph.node(op).op_type != "Constant")
            .flat_map(|&op| graph.node(op).outputs.iter().flatten())
            .filter(|&&tensor| {
                graph
                    .tensor(tensor)
                    .consumers
                    .iter()
                    .any(|c| at.get(c).is_some_and(|&i| i >= cut))
            })
            .count();
        cuts.push(((total - 2.0 * acc).abs(), crossing, cut));
    }
    let most_even = cuts.iter().map(|c| c.0).fold(total, f64::min);
    let (_, _, cut) = cuts
        .iter()
        .filter(|c| c.0 <= most_even + 0.03 * total)
        .min_by(|a, b| a.1.cmp(&b.1).then(a.0.total_cmp(&b.0)))
        .copied()
        .unwrap_or((0.0, 0, 0));
    Ok(ops
        .iter()
        .enumerate()
        .map(|(k, &op)| (graph.node(op).name.clone(), k < cut))
        .collect())
}

/// A model's bytes, graph and seeded inputs.
type Loaded = (Vec<u8>, Graph, Vec<(String, Tensor)>);

fn rec() -> Result<Option<Loaded>> {
    let path = model_path("ch_PP-OCRv4_rec_infer.onnx");
    if !path.exists() {
        println!(
            "(skipped: {} missing; run scripts/fetch-test-models.sh)",
            path.display()
        );
        return Ok(None);
    }
    let bytes = std::fs::read(&path)?;
    let graph = Graph::from_model(decode_model(&bytes)?)?;
    Ok(Some((bytes, graph.clone(), seeded_image(&graph, 48, 320)?)))
}

/// The model's one input as a seeded 1×3×`h`×`w` image in [-1, 1): the
/// size rapidocr feeds it (a text line is resized to 48×320 for rec; det
/// runs on the page, 320×320 here).
fn seeded_image(graph: &Graph, h: usize, w: usize) -> Result<Vec<(String, Tensor)>> {
    let name = graph.tensor(graph.inputs[0]).name.clone();
    let mut rng = synth::Rng::new(1);
    let values: Vec<f32> = (0..3 * h * w)
        .map(|_| rng.below(2000) as f32 / 1000.0 - 1.0)
        .collect();
    Ok(vec![(
        name,
        Tensor::from_values(vec![1, 3, h, w], &values)?,
    )])
}

fn split_options(halves: &[(String, bool)], a: &str, b: &str) -> LoadOptions {
    LoadOptions {
        devices: format!("HETERO:{a},{b}"),
        affinity: halves
            .iter()
            .map(|(n, first)| (n.clone(), if *first { a } else { b }.to_string()))
            .collect(),
        ..Default::default()
    }
}

async fn split() -> Result<()> {
    let Some((bytes, graph, inputs)) = rec()? else {
        return Ok(());
    };
    let halves = halves(&graph, &inputs)?;
    let (c, client) = cluster(2, None).await?;
    let network = client
        .load_network(
            bytes.clone(),
            split_options(&halves, "node-a/CPU", "node-b/CPU"),
        )
        .await?;
    let plugins: Vec<(DeviceId, Arc<dyn DevicePlugin>)> = vec![
        (DeviceId::parse("CPU")?, plugins::create("CPU")?),
        (
            DeviceId::parse("CPU_B")?,
            plugins::create_named("CPU", "CPU_B")?,
        ),
    ];
    let manual: BTreeMap<String, DeviceId> = halves
        .iter()
        .map(|(n, first)| {
            Ok((
                n.clone(),
                DeviceId::parse(if *first { "CPU" } else { "CPU_B" })?,
            ))
        })
        .collect::<Result<_>>()?;
    let local = hetero::Network::load(
        decode_model(&bytes)?,
        &plugins,
        &hetero::LoadOptions {
            priority: DevicePriority::parse("HETERO:CPU,CPU_B")?,
            policy: Policy::Priority,
            algorithm: Algorithm::Fast,
            strict: true,
            manual,
            config: Config::default(),
            shapes: Default::default(),
        },
    )?;
    let feeds: HashMap<String, Tensor> = inputs.iter().cloned().collect();
    let (mut remote_ms, mut local_ms) = (Vec::new(), Vec::new());
    // Where the time goes: compute (the subgraphs' own times) and the rest.
    let (mut remote_compute, mut local_compute) = (Vec::new(), Vec::new());
    let mut moved = Vec::new();
    for i in 0..23 {
        let t = Instant::now();
        let done = network.infer(inputs.clone()).await?;
        let r = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        let ran = local.run(&feeds)?;
        let l = t.elapsed().as_secs_f64() * 1e3;
        if i >= 3 {
            remote_ms.push(r);
            local_ms.push(l);
            remote_compute.push(
                done.subgraphs
                    .iter()
                    .map(|(_, d)| d.as_secs_f64() * 1e3)
                    .sum::<f64>(),
            );
            local_compute.push(
                ran.subgraphs
                    .iter()
                    .map(|(_, d, _)| d.as_secs_f64() * 1e3)
                    .sum::<f64>(),
            );
            moved.push(done.counters.transfers.iter().map(|t| t.bytes).sum::<u64>() as f64);
        }
    }
    let done = network.infer(inputs.clone()).await?;
    for t in &done.counters.transfers {
        println!(
            "  moved '{}' {} → {}: {} bytes, {} µs from its first byte to its last",
            t.tensor, t.from, t.to, t.bytes, t.micros
        );
    }
    let (r, l) = (median(remote_ms), median(local_ms));
    let (rc, lc) = (median(remote_compute), median(local_compute));
    println!(
        "rec (1x3x48x320) split in halves: two workers {r:.2} ms, one process (HETERO) {l:.2} ms, ratio {:.3} (median of 20, alternating)",
        r / l
    );
    println!(
        "  compute (sum of subgraph times): two workers {rc:.2} ms, one process {lc:.2} ms; \
         the rest: {:.2} ms vs {:.2} ms; {:.2} MB moved per request",
        r - rc,
        l - lc,
        median(moved) / 1e6
    );
    network.unload().await?;
    c.shutdown().await;
    Ok(())
}

/// CPU seconds used so far by this process's threads, by kind: the
/// subgraphs' compute threads (`sg-…`) and everything else, by thread name
/// (Linux `/proc`; empty elsewhere).
fn cpu_by_thread() -> BTreeMap<String, f64> {
    let mut by = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by;
    };
    // Clock ticks per second (USER_HZ), 100 on Linux.
    let hz = 100.0;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        // utime and stime: fields 14 and 15 of stat, 12 and 13 after comm.
        let ticks: f64 = fields
            .get(11..13)
            .map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum())
            .unwrap_or(0.0);
        let kind = if comm.starts_with("sg-") {
            "compute".to_string()
        } else {
            comm.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-')
                .to_string()
        };
        *by.entry(kind).or_default() += ticks / hz;
    }
    by
}

/// CPU seconds all threads used since `before` (a [`cpu_by_thread`]).
fn cpu_since(before: &BTreeMap<String, f64>) -> f64 {
    cpu_by_thread().values().sum::<f64>() - before.values().sum::<f64>()
}

/// Requests per second with `in_flight` requests outstanding.
async fn throughput(
    network: &Network,
    inputs: &[(String, Tensor)],
    total: usize,
    in_flight: usize,
) -> Result<f64> {
    let cpu_before = cpu_by_thread();
    let gate = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..total {
        let permit = gate.clone().acquire_owned().await?;
        let (network, inputs) = (network.clone(), inputs.to_vec());
        tasks.push(tokio::spawn(async move {
            // The outputs are dropped as each request completes, as a
            // caller consuming them would: kept until the end, they grew
            // the process by ~1 MB per rec request, all of it faulted in
            // fresh on the network threads.
            let r = network.infer(inputs).await.map(drop);
            drop(permit);
            r
        }));
    }
    for t in tasks {
        t.await??;
    }
    let wall = started.elapsed().as_secs_f64();
    if std::env::var_os("TESSERA_BENCH_CPU").is_some() {
        // Where the cores went, per request (threads that ended in between
        // are not counted).
        let after = cpu_by_thread();
        let per: Vec<String> = after
            .iter()
            .map(|(k, v)| (k, v - cpu_before.get(k).copied().unwrap_or(0.0)))
            .filter(|(_, v)| *v > 0.0)
            .map(|(k, v)| format!("{k} {:.2}", v * 1e3 / total as f64))
            .collect();
        let used = cpu_since(&cpu_before);
        println!(
            "    cpu ms per request: {}; {:.2} cores busy of the wall time",
            per.join(", "),
            used / wall
        );
    }
    Ok(total as f64 / wall)
}

async fn pipeline() -> Result<()> {
    if let Some(rec) = rec()? {
        pipeline_on("PP-OCRv4 rec (1x3x48x320)", rec, 96).await?;
    }
    if let Some(det) = det()? {
        pipeline_on("PP-OCRv4 det (1x3x320x320)", det, 32).await?;
    }
    Ok(())
}

/// The model split into two balanced stages ([`halves`]) on a cluster of
/// two single-threaded workers.
async fn two_stages(
    bytes: &[u8],
    graph: &Graph,
    inputs: &[(String, Tensor)],
) -> Result<(tessera_cli::cluster::Embedded, Network)> {
    let halves = halves(graph, inputs)?;
    let (c, client) = cluster(2, Some(1)).await?;
    let network = client
        .load_network(
            bytes.to_vec(),
            split_options(&halves, "node-a/CPU", "node-b/CPU"),
        )
        .await?;
    Ok((c, network))
}

/// rec's two stages on two workers, 16 in flight, for a while: nothing
/// else runs, so a profile shows the pipelined run's network work alone.
async fn pipelined_alone() -> Result<()> {
    let Some((bytes, graph, inputs)) = rec()? else {
        return Ok(());
    };
    let (c, two) = two_stages(&bytes, &graph, &inputs).await?;
    two.infer(inputs.clone()).await?;
    let rate = throughput(&two, &inputs, 480, 16).await?;
    println!("rec, two stages on two workers: {rate:.1} req/s");
    two.unload().await?;
    c.shutdown().await;
    Ok(())
}

/// rec's two stages on two single-threaded workers, on each CPU backend.
async fn backends() -> Result<()> {
    let Some((bytes, graph, inputs)) = rec()? else {
        return Ok(());
    };
    let mut rates: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for _ in 0..3 {
        for backend in [CpuBackend::Tract, CpuBackend::OnnxRuntime] {
            plugins::configure(PluginOptions {
                cpu_backend: backend,
                onnxruntime_library: None,
                calibration_dir: None,
            });
            let (c, two) = two_stages(&bytes, &graph, &inputs).await?;
            two.infer(inputs.clone()).await?;
            let rate = throughput(&two, &inputs, 96, 16).await?;
            rates.entry(backend.to_string()).or_default().push(rate);
            two.unload().await?;
            c.shutdown().await;
        }
    }
    plugins::configure(PluginOptions::default());
    let rate = |b: &str| median(rates.get(b).cloned().unwrap_or_default());
    let (ort, tract) = (rate("onnxruntime"), rate("tract"));
    println!(
        "PP-OCRv4 rec (1x3x48x320), two stages on two workers, one thread each, 16 in flight: \
         onnxruntime {ort:.1} req/s, tract {tract:.1} req/s, ratio {:.2} (median of 3, alternating)",
        ort / tract
    );
    Ok(())
}

/// PP-OCRv4 det on a 320×320 seeded image: more compute per byte moved
/// than rec.
fn det() -> Result<Option<Loaded>> {
    let path = model_path("ch_PP-OCRv4_det_infer.onnx");
    if !path.exists() {
        println!("(skipped: {} missing)", path.display());
        return Ok(None);
    }
    let bytes = std::fs::read(&path)?;
    let graph = Graph::from_model(decode_model(&bytes)?)?;
    Ok(Some((
        bytes,
        graph.clone(),
        seeded_image(&graph, 320, 320)?,
    )))
}

/// Two balanced stages on two workers vs the whole model on one, one
/// thread each, `in_flight` requests outstanding.
async fn pipeline_on(label: &str, (bytes, graph, inputs): Loaded, total: usize) -> Result<()> {
    let in_flight = 16;
    let (c2, two) = two_stages(&bytes, &graph, &inputs).await?;
    let (c1, client1) = cluster(1, Some(1)).await?;
    let one = client1
        .load_network(bytes, LoadOptions::devices("HETERO:node-a/CPU"))
        .await?;
    two.infer(inputs.clone()).await?;
    let stages = two.infer(inputs.clone()).await?;
    let moved: u64 = stages.counters.transfers.iter().map(|t| t.bytes).sum();
    println!(
        "{label}: stage times (µs) {:?}, {:.2} MB moved between nodes per request",
        stages
            .subgraphs
            .iter()
            .map(|(s, d)| (*s, d.as_micros()))
            .collect::<Vec<_>>(),
        moved as f64 / 1e6
    );
    one.infer(inputs.clone()).await?;
    let ceiling = Ceiling::new(&graph, &inputs)?;
    let (mut t2, mut t1, mut bound) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        t2.push(throughput(&two, &inputs, total, in_flight).await?);
        t1.push(throughput(&one, &inputs, total, in_flight).await?);
        bound.push(ceiling.ratio(total / 2)?);
    }
    let (t2, t1) = (median(t2), median(t1));
    println!(
        "pipelining {label}, {in_flight} in flight, one thread per worker: two stages on two workers \
         {t2:.1} req/s, one worker {t1:.1} req/s, ratio {:.2} (median of 3, alternating)",
        t2 / t1
    );
    two.unload().await?;
    one.unload().await?;
    c2.shutdown().await;
    c1.shutdown().await;
    println!(
        "  the ceiling here: the whole model in one process, two threads each running it vs one thread, \
         throughput ratio {:.2} (no network; what two busy cores give this machine; median of 3, \
         alternating with the above)",
        median(bound)
    );
    Ok(())
}

/// The whole model compiled twice in this process (CPU plugin, one thread
/// each), with no network: its throughput on two threads at once over one
/// thread alone is how much two busy cores give on this machine, the
/// bound on pipelining two stages over two single-threaded workers.
struct Ceiling {
    nets: [hetero::Network; 2],
    feeds: HashMap<String, Tensor>,
}

impl Ceiling {
    fn new(graph: &Graph, inputs: &[(String, Tensor)]) -> Result<Ceiling> {
        let load = || -> Result<hetero::Network> {
            let plugins: Vec<(DeviceId, Arc<dyn DevicePlugin>)> =
                vec![(DeviceId::parse("CPU")?, plugins::create("CPU")?)];
            Ok(hetero::Network::load(
                graph.model().clone(),
                &plugins,
                &hetero::LoadOptions::by_priority(DevicePriority::parse("HETERO:CPU")?),
            )?)
        };
        let ceiling = Ceiling {
            nets: [load()?, load()?],
            feeds: inputs.iter().cloned().collect(),
        };
        ceiling.run(&ceiling.nets[0], 1)?;
        ceiling.run(&ceiling.nets[1], 1)?;
        Ok(ceiling)
    }

    fn run(&self, net: &hetero::Network, runs: usize) -> Result<()> {
        for _ in 0..runs {
            net.run(&self.feeds)?;
        }
        Ok(())
    }

    /// Two threads' throughput over one thread's, `runs` requests each.
    fn ratio(&self, runs: usize) -> Result<f64> {
        let t = Instant::now();
        self.run(&self.nets[0], runs)?;
        let one = runs as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        std::thread::scope(|scope| -> Result<()> {
            let other = scope.spawn(|| self.run(&self.nets[1], runs));
            self.run(&self.nets[0], runs)?;
            other
                .join()
                .map_err(|_| anyhow::anyhow!("a compute thread panicked"))?
        })?;
        let two = 2.0 * runs as f64 / t.elapsed().as_secs_f64();
        Ok(two / one)
    }
}

/// One tensor at a time over an idle link (the way a request's tensors
/// go): median latency from send to whole arrival, the link on QUIC and
/// through shared memory vs TCP.
async fn hop() -> Result<()> {
    println!("one tensor at a time between two nodes on loopback, idle in between (median of 50)");
    println!(
        "{:<10} {:>8} {:>10} {:>8} {:>9} {:>11}",
        "tensor", "QUIC µs", "shared µs", "TCP µs", "TCP/QUIC", "TCP/shared"
    );
    let (a, b, link, mut arrived) = quic_pair(false).await?;
    let (c, d, shared_link, mut shared_arrived) = quic_pair(true).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let tcp_addr = listener.local_addr()?;
    let mut tcp = tokio::net::TcpStream::connect(tcp_addr).await?;
    tcp.set_nodelay(true)?;
    let (mut server, _) = listener.accept().await?;
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(2));
    for size in [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20] {
        let tensor = Tensor::new(ElemType::UINT8, vec![size], vec![1u8; size])?;
        let mut buf = vec![0u8; size];
        let (mut quic, mut shared, mut plain) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..60 {
            pause().await;
            let t = Instant::now();
            link.send_tensor(1, i, "t", &tensor).await?;
            arrived.recv().await.context("receiver closed")?;
            let q = t.elapsed().as_secs_f64() * 1e6;
            pause().await;
            let t = Instant::now();
            shared_link.send_tensor(1, i, "t", &tensor).await?;
            shared_arrived.recv().await.context("receiver closed")?;
            let m = t.elapsed().as_secs_f64() * 1e6;
            pause().await;
            let t = Instant::now();
            let (sent, read) =
                tokio::join!(tcp.write_all(tensor.bytes()), server.read_exact(&mut buf));
            sent?;
            read?;
            if i >= 10 {
                quic.push(q);
                shared.push(m);
                plain.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        let (q, m, t) = (median(quic), median(shared), median(plain));
        println!(
            "{:<10} {q:>8.0} {m:>10.0} {t:>8.0} {:>9.2} {:>11.2}",
            format!("{} KB", size >> 10),
            t / q,
            t / m
        );
    }
    for node in [a, b, c, d] {
        node.shutdown().await;
    }
    Ok(())
}
