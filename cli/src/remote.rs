//! `tessera run` on a cluster: through the client SDK, either to a running
//! coordinator (`--coordinator ADDR`, certificates from `--certs`) or to an
//! embedded local cluster started in this process.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tessera_cli::cluster::WorkerSpec;
use tessera_client::{Client, LoadOptions, Replicas};
use tessera_common::memory::format_size;
use tessera_common::onnx;
use tessera_worker::daemon::config::MemoryLimits;

use crate::run::{read_inputs, write_outputs, RunArgs};

/// Which cluster: `--coordinator ADDR` with certificates from `--certs`,
/// or an embedded local cluster started in this process.
#[derive(Args, Clone)]
pub struct RemoteArgs {
    /// The cluster's coordinator (default: start an embedded local
    /// cluster); with HA, every coordinator, comma-separated (the leader is
    /// found among them).
    #[arg(long, value_name = "ADDR")]
    pub coordinator: Option<String>,
    /// Directory made by `tessera certs init` (with --coordinator).
    #[arg(long, default_value = "certs")]
    pub certs: PathBuf,
    /// This client's name: its certificate is `<certs>/<name>.pem`.
    #[arg(long, default_value = "client")]
    pub name: String,
    /// The cluster's name (with --coordinator).
    #[arg(long, default_value = "tessera")]
    pub cluster: String,
    /// Workers of the embedded local cluster.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Devices each embedded worker serves.
    #[arg(long, default_value = "CPU", value_delimiter = ',')]
    pub worker_devices: Vec<String>,
    /// Threads per subgraph on each embedded worker (plugin NUM_THREADS).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The most memory each embedded worker's devices offer: a size
    /// (64MiB, 2GiB) or KIND=SIZE pairs; once for every worker, or once
    /// per worker in order (--worker-memory 96MiB --worker-memory 48MiB).
    #[arg(long, value_name = "SIZE")]
    pub worker_memory: Vec<MemoryLimits>,
    /// Embedded workers count time per node (plugin PERF_COUNT).
    #[arg(skip)]
    pub perf_counts: bool,
    /// The request's deadline in milliseconds (default: the coordinator's).
    #[arg(long)]
    pub deadline_ms: Option<u64>,
}

/// How a loaded network serves: copies and dynamic batching.
#[derive(Args, Clone, Debug)]
pub struct ServingArgs {
    /// Copies of the network, requests balanced over them by least
    /// outstanding work: a number, or auto (the cost model picks how many
    /// and how each is split).
    #[arg(long, default_value = "1", value_name = "N|auto")]
    pub replicas: Replicas,
    /// Dynamic batching: run up to this many waiting requests as one batch
    /// (the model's first dimension must be dynamic; 0: off).
    #[arg(long, default_value_t = 0)]
    pub max_batch: u32,
    /// How long a request waits for others to join its batch, µs.
    #[arg(long, default_value_t = 500)]
    pub max_queue_delay_us: u64,
}

impl ServingArgs {
    /// `options` with these copies and batching.
    pub fn apply(&self, mut options: LoadOptions) -> LoadOptions {
        options.replicas = self.replicas;
        if self.max_batch > 0 {
            options = options.batching(
                self.max_batch,
                std::time::Duration::from_micros(self.max_queue_delay_us),
            );
        }
        options
    }
}

/// Connects to the coordinator, or starts an embedded cluster and connects
/// to it.
pub async fn connect(
    args: &RemoteArgs,
) -> Result<(Client, Option<tessera_cli::cluster::Embedded>)> {
    match &args.coordinator {
        Some(addr) => {
            let addrs = tessera_cli::resolve_coordinators(addr).await?;
            let id = tessera_net::certs::load_identity(&args.certs, &args.name)
                .context("the client's certificate (make one with `tessera certs init`)")?;
            let role = tessera_common::wire::handshake::Role::Client;
            let client = Client::connect_any(&addrs, &id, &args.cluster, role).await?;
            Ok((client, None))
        }
        None => {
            let mut config = Vec::new();
            if args.perf_counts {
                config.push(("PERF_COUNT".to_string(), "YES".to_string()));
            }
            if let Some(t) = args.threads {
                config.push(("NUM_THREADS".to_string(), t.to_string()));
            }
            let limits = &args.worker_memory;
            if limits.len() > 1 && limits.len() != args.workers {
                bail!(
                    "--worker-memory given {} times for {} workers: give it once for all, or once per worker",
                    limits.len(),
                    args.workers
                );
            }
            let specs: Vec<WorkerSpec> = (0..args.workers)
                .map(|i| WorkerSpec {
                    memory_limit: limits
                        .get(i)
                        .or(limits.first())
                        .cloned()
                        .unwrap_or_default(),
                    ..WorkerSpec::new(&args.worker_devices, &config)
                })
                .collect();
            let cluster = tessera_cli::cluster::start_workers(&specs, |_| {}).await?;
            eprintln!(
                "embedded cluster: coordinator on {}, workers {}",
                cluster.addr,
                cluster.workers.join(", ")
            );
            let client =
                Client::connect(cluster.addr, &cluster.client, tessera_cli::cluster::CLUSTER)
                    .await?;
            Ok((client, Some(cluster)))
        }
    }
}

/// Runs `body` with a client of the cluster `args` names. An embedded
/// cluster started for it is shut down in order afterwards, whether `body`
/// succeeded or not, so that no subgraph still computes while the process
/// exits.
pub async fn with_client<T>(
    args: &RemoteArgs,
    body: impl AsyncFnOnce(Client) -> Result<T>,
) -> Result<T> {
    let (client, embedded) = connect(args).await?;
    let result = body(client).await;
    if let Some(cluster) = embedded {
        cluster.shutdown().await;
    }
    result
}

/// Reads a manual affinity file: JSON `{"node": "host/DEVICE"}`.
pub fn read_affinity(path: Option<&std::path::Path>) -> Result<Vec<(String, String)>> {
    let Some(path) = path else {
        return Ok(Vec::new());
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let map: BTreeMap<String, String> = serde_json::from_str(&text)
        .with_context(|| format!("{}: expected {{\"node\": \"host/DEVICE\"}}", path.display()))?;
    Ok(map.into_iter().collect())
}

pub fn run(mut args: RunArgs) -> Result<()> {
    args.remote.perf_counts = args.perf_counts;
    tessera_cli::cluster::run_system(run_async(args))
}

async fn run_async(args: RunArgs) -> Result<()> {
    let path = args.model.clone();
    let tessera_cli::ModelRead { bytes, sha256, .. } =
        tokio::task::spawn_blocking(move || tessera_cli::read_model(&path, 1)).await??;
    let shapes = tessera_cli::parse_shapes(&args.shapes)?;
    // Random inputs take the shapes the network will be planned for.
    let (graph, _) = tessera_common::plan::prepare(
        &onnx::decode_model(&bytes).with_context(|| format!("{}", args.model.display()))?,
        &shapes,
    )?;
    let inputs = read_inputs(&args, &graph)?;
    with_client(&args.remote, async |client| {
        let affinity = read_affinity(args.affinity.as_deref())?;
        let options = LoadOptions {
            name: args.model.display().to_string(),
            devices: args.devices.clone().unwrap_or_default(),
            policy: args.policy,
            strict: args.strict,
            affinity,
            shapes: shapes.into_iter().collect(),
            model_sha256: sha256,
            ..Default::default()
        };
        let options = args.serving.apply(options);
        let started = Instant::now();
        let mut network = crate::progress::load_network(&client, bytes, options).await?;
        eprintln!("loaded in {:.2} s", started.elapsed().as_secs_f64());
        if let Some(ms) = args.remote.deadline_ms {
            network = network.with_deadline(std::time::Duration::from_millis(ms));
        }
        network = network.with_counters(args.perf_counts);
        let mut out = plan_lines(network.plan());
        let started = Instant::now();
        let result = network.infer(inputs.into_iter().collect()).await?;
        let total = started.elapsed();
        use std::fmt::Write as _;
        let _ = writeln!(out, "request: {:.2} ms", total.as_secs_f64() * 1e3);
        if args.perf_counts {
            let mut sum = 0;
            for (sg, time) in &result.subgraphs {
                let device = network
                    .plan()
                    .subgraphs
                    .iter()
                    .find(|s| s.id as u64 == u64::from(*sg))
                    .map_or("?", |s| s.device.as_str());
                let _ = writeln!(out, "subgraph{sg} ({device}): {} µs", time.as_micros());
                sum += time.as_micros();
            }
            for (sg, n) in &result.counters.nodes {
                let _ = writeln!(out, "subgraph{sg}: {}: realTime: {} µs", n.node, n.micros);
            }
            for t in &result.counters.transfers {
                let _ = writeln!(
                    out,
                    "transfer {} {} → {}: {} bytes in {} µs",
                    t.tensor, t.from, t.to, t.bytes, t.micros
                );
            }
            let _ = writeln!(
                out,
                "Total compute: {sum} microseconds; network and scheduling: {} microseconds",
                total.as_micros().saturating_sub(sum)
            );
        }
        for (name, t) in &result.tensors {
            let _ = writeln!(out, "output {name}: {} {:?}", t.elem(), t.shape());
        }
        write_outputs(&args, &result.tensors, &mut out)?;
        crate::print_stdout(&out);
        network.unload().await?;
        Ok(())
    })
    .await
}

/// The plan, one line per subgraph.
pub fn plan_lines(plan: &tessera_client::Plan) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} subgraphs on {}",
        plan.subgraphs.len(),
        plan.hosts.join(", ")
    );
    if !plan.simplified.is_empty() {
        let _ = writeln!(out, "simplified: {}", plan.simplified.summary());
    }
    for sg in &plan.subgraphs {
        let _ = writeln!(
            out,
            "subgraph{} on {}: {} nodes, inputs {}, outputs {}, needs {}",
            sg.id,
            sg.device,
            sg.nodes.len(),
            sg.inputs.join(","),
            sg.outputs.join(","),
            format_size(sg.memory.total())
        );
    }
    if let Some(p) = &plan.memory.pipelined {
        let _ = writeln!(out, "memory: {}", p.reason);
        for (i, s) in p.stages.iter().enumerate() {
            let offered = s.budget.map_or("no limit".to_string(), format_size);
            let _ = writeln!(
                out,
                "  stage {} on {}: {}..{} ({} nodes), needs {} of {offered}, predicted {:.0} µs a request",
                i + 1,
                s.device,
                s.first,
                s.last,
                s.nodes,
                s.need,
                s.time_us
            );
        }
    }
    for c in &plan.considered {
        let _ = match c.predicted_rps {
            Some(rps) => writeln!(out, "auto: {} copies predict {rps:.0} req/s", c.copies),
            None => writeln!(
                out,
                "auto: {} copies cannot be planned: {}",
                c.copies, c.note
            ),
        };
    }
    if plan.replicas.len() > 1 {
        let _ = writeln!(
            out,
            "{} replicas, predicted {:.0} req/s:",
            plan.replicas.len(),
            plan.predicted_rps
        );
        for (i, r) in plan.replicas.iter().enumerate() {
            let _ = writeln!(
                out,
                "replica {} on {}: {} subgraphs, predicted {:.0} µs a request, {:.0} req/s",
                i + 1,
                r.hosts.join(","),
                r.devices.len(),
                r.predicted_latency_us,
                r.predicted_rps
            );
        }
    }
    out
}
