//! `tessera query`, `plan`, `bench` and `cluster`: questions to a cluster
//! (`--coordinator ADDR`) or to an embedded local one.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use std::collections::HashMap;
use tessera_client::LoadOptions;
use tessera_common::affinity::Policy;

use tessera_common::graph::Graph;
use tessera_common::memory::format_size;
use tessera_common::onnx;
use tessera_common::tensor::Tensor;

use crate::remote::{plan_lines, read_affinity, with_client, RemoteArgs, ServingArgs};

/// A model and how to place it.
#[derive(Args)]
pub struct ModelArgs {
    /// The model: an ONNX file, a GGUF file or a generative model folder.
    pub(crate) model: PathBuf,
    /// Device priority, e.g. HETERO:node-a/CPU,node-b/CPU (a bare kind: that
    /// kind on every worker; default: every device).
    #[arg(long, default_value = "")]
    devices: String,
    /// priority or cost.
    #[arg(long, default_value = "priority")]
    policy: Policy,
    /// Fail if a node is supported by no device.
    #[arg(long)]
    strict: bool,
    /// Manual affinity JSON {"node": "host/DEVICE"}.
    #[arg(long)]
    affinity: Option<PathBuf>,
    /// NAME=d0,d1,...: a concrete shape for a graph input; the model is
    /// simplified for it (shape computations folded) and takes only inputs
    /// of that shape. Without it dynamic dims stay dynamic.
    #[arg(long = "shape", value_name = "NAME=d0,d1,...")]
    pub(crate) shapes: Vec<String>,
    #[command(flatten)]
    pub(crate) serving: ServingArgs,
    #[command(flatten)]
    pub(crate) remote: RemoteArgs,
}

impl ModelArgs {
    /// The model's bytes (a generative model's graph, built or read).
    pub(crate) fn read(&self) -> Result<bytes::Bytes> {
        Ok(tessera_cli::read_model(&self.model, 1)?.bytes)
    }

    /// The model's bytes and the options to load them with, the bytes
    /// named by their remembered hash ([`tessera_cli::ModelRead`]).
    pub(crate) fn read_to_load(&self) -> Result<(bytes::Bytes, LoadOptions)> {
        let read = tessera_cli::read_model(&self.model, 1)?;
        let options = LoadOptions {
            model_sha256: read.sha256,
            ..self.options()?
        };
        Ok((read.bytes, options))
    }

    pub(crate) fn options(&self) -> Result<LoadOptions> {
        let options = LoadOptions {
            name: self.model.display().to_string(),
            devices: self.devices.clone(),
            policy: self.policy,
            strict: self.strict,
            affinity: read_affinity(self.affinity.as_deref())?,
            shapes: tessera_cli::parse_shapes(&self.shapes)?
                .into_iter()
                .collect(),
            ..Default::default()
        };
        Ok(self.serving.apply(options))
    }
}

#[derive(Args)]
pub struct QueryArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// List the unsupported nodes with the reason.
    #[arg(long)]
    verbose: bool,
}

#[derive(Args)]
pub struct PlanArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Write `<model>_plan.json` and `<model>_plan.dot` here.
    #[arg(long)]
    dump_dir: Option<PathBuf>,
    /// Print why each node went where.
    #[arg(long)]
    explain: bool,
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Requests in all.
    #[arg(long, default_value_t = 64)]
    requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// The seed of the random inputs (the same seed, the same inputs).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// NAME=FILE.npy: this input from a file (the others are random, of
    /// the model's shapes with `--shape` applied; a dynamic dim left open
    /// is 1 for the first dim, 64 for the others).
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    inputs: Vec<String>,
}

#[derive(Args)]
pub struct ClusterArgs {
    /// Print the cluster document (JSON), as a front door's `GET
    /// /api/cluster` answers it.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: RemoteArgs,
}

fn model_stem(path: &std::path::Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

pub fn query(args: QueryArgs) -> Result<()> {
    tessera_cli::cluster::run_system(async move {
        let bytes = args.model.read()?;
        with_client(&args.model.remote, async |client| {
            let answers = client.query(bytes, &args.model.devices).await?;
            let mut out = String::new();
            use std::fmt::Write as _;
            for a in &answers {
                let total = a.supported.len() + a.unsupported.len();
                let _ = writeln!(
                    out,
                    "{}: supports {} of {total} nodes",
                    a.device,
                    a.supported.len()
                );
                if args.verbose {
                    for (node, why) in &a.unsupported {
                        let _ = writeln!(out, "  {node}: {why}");
                    }
                }
            }
            crate::print_stdout(&out);
            Ok(())
        })
        .await
    })
}

pub fn plan(args: PlanArgs) -> Result<()> {
    tessera_cli::cluster::run_system(async move {
        let bytes = args.model.read()?;
        with_client(&args.model.remote, async |client| {
            let plan = client.plan(bytes, args.model.options()?).await?;
            let mut out = plan_lines(&plan);
            use std::fmt::Write as _;
            let (compute, transfer): (f64, f64) =
                plan.subgraphs.iter().fold((0.0, 0.0), |(c, t), s| {
                    (c + s.predicted_compute_us, t + s.predicted_transfer_us)
                });
            for sg in &plan.subgraphs {
                let _ = writeln!(
                    out,
                    "subgraph{}: predicted {:.0} µs compute, {:.0} µs moving its inputs",
                    sg.id, sg.predicted_compute_us, sg.predicted_transfer_us
                );
            }
            let _ = writeln!(
                out,
                "predicted total: {compute:.0} µs compute, {transfer:.0} µs transfers (sequential)"
            );
            if args.explain {
                for d in &plan.memory.devices {
                    let offered = d.offered.map_or("no limit".to_string(), format_size);
                    let _ = writeln!(out, "{} needs {} of {offered}", d.device, d.need);
                }
                for (node, why) in &plan.explanations {
                    let device = plan.affinity.get(node).map_or("?", String::as_str);
                    let why = serde_json::to_string(why)?;
                    let _ = writeln!(out, "{node} → {device}: {why}");
                }
            }
            if let Some(dir) = &args.dump_dir {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                let stem = model_stem(&args.model.model);
                let json_path = dir.join(format!("{stem}_plan.json"));
                std::fs::write(&json_path, serde_json::to_string_pretty(&plan)?)
                    .with_context(|| format!("cannot write {}", json_path.display()))?;
                let graph = Graph::from_model(onnx::decode_model(&args.model.read()?)?)?;
                let dot_path = dir.join(format!("{stem}_plan.dot"));
                std::fs::write(&dot_path, plan_dot(&graph, &plan))
                    .with_context(|| format!("cannot write {}", dot_path.display()))?;
                let _ = writeln!(
                    out,
                    "wrote {} and {}",
                    json_path.display(),
                    dot_path.display()
                );
            }
            crate::print_stdout(&out);
            Ok(())
        })
        .await
    })
}

/// GraphViz: one cluster box per subgraph (labelled with its device),
/// nodes inside, edges between nodes.
fn plan_dot(graph: &Graph, plan: &tessera_client::Plan) -> String {
    use std::fmt::Write as _;
    let mut out = String::from("digraph plan {\n  rankdir=TB;\n  node [shape=box, fontsize=10];\n");
    let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    for sg in &plan.subgraphs {
        let id = sg.id;
        let _ = writeln!(
            out,
            "  subgraph cluster_{id} {{\n    label=\"subgraph{id} on {}\";",
            quote(&sg.device)
        );
        for n in &sg.nodes {
            let _ = writeln!(out, "    \"{}\";", quote(n));
        }
        out.push_str("  }\n");
    }
    let placed = &plan.affinity;
    for &op in graph.topo_ops() {
        let node = graph.node(op);
        for t in node.all_inputs() {
            let producer = &graph.node(graph.tensor(t).producer).name;
            if placed.contains_key(producer.as_str()) {
                let _ = writeln!(
                    out,
                    "  \"{}\" -> \"{}\";",
                    quote(producer),
                    quote(&node.name)
                );
            }
        }
    }
    out.push_str("}\n");
    out
}

pub fn bench(args: BenchArgs) -> Result<()> {
    if args.requests == 0 || args.concurrency == 0 {
        bail!("--requests and --concurrency must be at least 1");
    }
    // Read (and for a large model hashed) before the runtime starts.
    let (bytes, options) = args.model.read_to_load()?;
    tessera_cli::cluster::run_system(async move {
        let inputs = bench_inputs(&args, &bytes)?;
        with_client(&args.model.remote, async |client| {
            let network = crate::progress::load_network(&client, bytes, options).await?;
            crate::print_stdout(&plan_lines(network.plan()));
            // Warm-up: the first request specializes plans for its shapes.
            network.infer(inputs.clone()).await?;
            let gate = Arc::new(tokio::sync::Semaphore::new(args.concurrency));
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let bar = crate::progress::requests(args.requests as u64);
            let started = Instant::now();
            for _ in 0..args.requests {
                let permit = gate.clone().acquire_owned().await?;
                let (network, inputs, tx) = (network.clone(), inputs.clone(), tx.clone());
                tokio::spawn(async move {
                    let t = Instant::now();
                    let r = network.infer(inputs).await.map(|_| t.elapsed());
                    drop(permit);
                    let _ = tx.send(r);
                });
            }
            drop(tx);
            let mut latencies: Vec<Duration> = Vec::with_capacity(args.requests);
            let mut failures = Vec::new();
            while let Some(r) = rx.recv().await {
                match r {
                    Ok(d) => latencies.push(d),
                    Err(e) => failures.push(e.to_string()),
                }
                bar.inc(1);
            }
            bar.finish_and_clear();
            let elapsed = started.elapsed();
            if let Some(first) = failures.first() {
                bail!(
                    "{} of {} requests failed; first: {first}",
                    failures.len(),
                    args.requests
                );
            }
            latencies.sort();
            let at = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];
            crate::print_stdout(&format!(
                "{} requests, {} in flight: {:.1} requests/s; latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms\n",
                args.requests,
                args.concurrency,
                args.requests as f64 / elapsed.as_secs_f64(),
                at(0.5).as_secs_f64() * 1e3,
                at(0.9).as_secs_f64() * 1e3,
                at(0.99).as_secs_f64() * 1e3,
            ));
            network.unload().await?;
            Ok(())
        })
        .await
    })
}

/// The bench's inputs: `--input` files, the others random of the shapes
/// the network is planned for (`--shape`).
fn bench_inputs(args: &BenchArgs, bytes: &[u8]) -> Result<Vec<(String, Tensor)>> {
    let shapes = tessera_cli::parse_shapes(&args.model.shapes)?;
    let (graph, _) = tessera_common::plan::prepare(&onnx::decode_model(bytes)?, &shapes)?;
    let mut given: HashMap<String, Tensor> = HashMap::new();
    for spec in &args.inputs {
        let (name, t) = crate::run::input_file(spec)?;
        given.insert(name, t);
    }
    let random = tessera_common::synth::random_inputs(&graph, args.seed);
    let mut inputs = Vec::new();
    for &t in &graph.inputs {
        let name = &graph.tensor(t).name;
        let tensor = match given.remove(name) {
            Some(t) => t,
            None => random
                .as_ref()
                .and_then(|r| r.iter().find(|(n, _)| n == name))
                .map(|(_, t)| t.clone())
                .with_context(|| {
                    format!("input '{name}' has an unknown or non-numeric type: give it with --input {name}=FILE.npy")
                })?,
        };
        inputs.push((name.clone(), tensor));
    }
    if let Some(name) = given.keys().next() {
        let names: Vec<&str> = graph
            .inputs
            .iter()
            .map(|&t| graph.tensor(t).name.as_str())
            .collect();
        bail!(
            "--input {name}: the model has no such input (inputs: {})",
            names.join(", ")
        );
    }
    Ok(inputs)
}

pub fn cluster(args: ClusterArgs) -> Result<()> {
    tessera_cli::cluster::run_system(async move {
        with_client(&args.remote, async |client| {
            let state = client.cluster().await?;
            if args.json {
                let doc = tessera_serving::views::ClusterDoc::of(&state);
                crate::print_stdout(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
                return Ok(());
            }
            let mut out = String::new();
            use std::fmt::Write as _;
            let _ = writeln!(
                out,
                "{} workers, {} networks loaded, {} requests running",
                state.workers.len(),
                state.networks,
                state.in_flight
            );
            for c in &state.coordinators {
                let role = if c.leading { "leader" } else { "standby" };
                let _ = writeln!(out, "coordinator {} ({role}), epoch {}", c.addr, c.epoch);
            }
            for w in &state.workers {
                let rss = match w.rss_bytes {
                    0 => String::new(),
                    b => format!(", resident {}", format_size(b)),
                };
                let _ = writeln!(
                    out,
                    "{} at {}: last heard {} ms ago, rtt {} µs, link {:.2} GB/s, running {}, networks {:?}{rss}, \
                     compiled {}, from its cache {}",
                    w.name,
                    w.data_addr,
                    w.silent_ms,
                    w.rtt_us,
                    w.bandwidth_gbps,
                    w.running,
                    w.networks,
                    w.compiles.compiled,
                    w.compiles.cache_loads
                );
                for d in &w.devices {
                    let used = w
                        .memory_in_use
                        .iter()
                        .find(|(kind, _)| *kind == d.device)
                        .map_or(0, |(_, b)| *b);
                    let memory = match d.memory_bytes {
                        0 => format!("memory not reported, {} in use", format_size(used)),
                        m => format!("memory {}, {} in use", format_size(m), format_size(used)),
                    };
                    let _ = writeln!(
                        out,
                        "  {}/{}: {} ({:.1} GFLOPS, {:.1} GB/s, {memory})",
                        w.name, d.device, d.full_name, d.gflops, d.bandwidth_gbps
                    );
                }
            }
            crate::print_stdout(&out);
            Ok(())
        })
        .await
    })
}
