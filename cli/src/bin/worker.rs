//! `worker --devices CPU [--name node-a] [--listen ADDR] [--coordinator
//! ADDR] [--config worker.toml]`: serves this machine's devices to a
//! cluster. Prints `registered as NAME, data on ADDR` once registered.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use tessera_worker::daemon::config::{MemoryLimits, WorkerConfig};
use tessera_worker::daemon::{self, WorkerOptions};
use tessera_worker::plugins::{self, CpuBackend, PluginOptions};

#[derive(Parser)]
#[command(name = "worker", version, about = "Tessera's worker")]
struct Args {
    /// Device kinds to serve, e.g. CPU,GPU.
    #[arg(long, value_delimiter = ',')]
    devices: Vec<String>,
    /// This worker's name (its certificate is <certs>/<name>.pem).
    #[arg(long)]
    name: Option<String>,
    /// Address for worker-to-worker streams (port 0: any free port).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Address other workers dial (`host:port`), if not the bound one.
    #[arg(long)]
    advertise: Option<String>,
    /// The coordinator's address (`host:port`, e.g. coordinator:7400).
    #[arg(long)]
    coordinator: Option<String>,
    /// Exit when the coordinator goes away instead of dialling it again.
    #[arg(long)]
    once: bool,
    /// TOML configuration (keys: configs/worker.toml); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Directory made by `tessera certs init`.
    #[arg(long)]
    certs: Option<PathBuf>,
    /// The cluster's name, as its certificates carry it (default: the
    /// config's, else tessera).
    #[arg(long)]
    cluster: Option<String>,
    /// Threads per subgraph (plugin NUM_THREADS).
    #[arg(long)]
    threads: Option<usize>,
    /// Compiled-subgraph cache directory.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// The most memory each device offers for models: a size (64MiB,
    /// 2GiB) for every device, or KIND=SIZE pairs (CPU=2GiB,GPU=8GiB).
    /// Without it a CPU device offers the machine's available memory and a
    /// GPU what its adapter reports.
    #[arg(long, value_name = "SIZE")]
    memory_limit: Option<MemoryLimits>,
    /// The CPU backend: auto (onnxruntime where its library loads, else
    /// tract), tract or onnxruntime.
    #[arg(long)]
    cpu_backend: Option<CpuBackend>,
    /// onnxruntime's shared library (libonnxruntime.so.1.32.0).
    #[arg(long)]
    onnxruntime_library: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    tessera_cli::tune_allocator();
    tessera_worker::crash::install();
    tessera_cli::quiet_vulkan_device_select();
    tessera_cli::init_tracing();
    tessera_cli::exit(run(Args::parse()))
}

fn parse_addr(what: &str, text: &str) -> Result<SocketAddr> {
    text.parse()
        .with_context(|| format!("{what}: '{text}' is not an address like 127.0.0.1:7400"))
}

fn run(args: Args) -> Result<()> {
    let file = match &args.config {
        Some(path) => WorkerConfig::load(path)?,
        None => WorkerConfig::default(),
    };
    let devices = if args.devices.is_empty() {
        file.devices.clone().unwrap_or_else(|| vec!["CPU".into()])
    } else {
        args.devices.clone()
    };
    let name = args
        .name
        .or(file.name)
        .unwrap_or_else(|| "node-a".to_string());
    let listen = match (args.listen, &file.listen) {
        (Some(a), _) => a,
        (None, Some(text)) => parse_addr("listen", text)?,
        (None, None) => SocketAddr::from(([127, 0, 0, 1], 0)),
    };
    let advertise = args.advertise.or(file.advertise);
    let Some(coordinator) = args.coordinator.or(file.coordinator) else {
        bail!("no coordinator: pass --coordinator ADDR or set it in --config");
    };
    let certs = args
        .certs
        .or(file.certs)
        .unwrap_or_else(|| PathBuf::from("certs"));
    let mut plugin = file.plugin;
    let cpu_backend = match (args.cpu_backend, plugin.remove("backend")) {
        (Some(b), _) => b,
        (None, Some(text)) => text
            .parse()
            .map_err(anyhow::Error::msg)
            .context("[plugin] backend")?,
        (None, None) => CpuBackend::Auto,
    };
    let cache_dir = args.cache_dir.or(file.cache_dir);
    plugins::configure(PluginOptions {
        cpu_backend,
        onnxruntime_library: args.onnxruntime_library.or(file.onnxruntime_library),
        // What it measured of its CPU is kept with its compile cache.
        calibration_dir: cache_dir.clone(),
    });
    let mut config: Vec<(String, String)> = plugin.into_iter().collect();
    if let Some(t) = args.threads {
        config.push(("NUM_THREADS".into(), t.to_string()));
    }
    let memory_limit = match (args.memory_limit, &file.memory_limit) {
        (Some(l), _) => l,
        (None, Some(text)) => text
            .parse()
            .map_err(anyhow::Error::msg)
            .context("memory_limit in the worker's config")?,
        (None, None) => MemoryLimits::default(),
    };
    let options = WorkerOptions {
        name: name.clone(),
        devices,
        listen,
        advertise,
        coordinator,
        reconnect: !args.once,
        cluster: args
            .cluster
            .or(file.cluster)
            .unwrap_or_else(|| "tessera".into()),
        mailbox: file.mailbox.unwrap_or(64),
        cache_dir,
        config,
        memory_limit,
    };
    let identity = tessera_net::certs::load_identity(&certs, &name)
        .with_context(|| format!("the certificate of '{name}' in {}", certs.display()))?;
    tessera_cli::cluster::run_system(async move {
        let announced = name.clone();
        daemon::run_until(
            options,
            &identity,
            move |addr: &str| {
                tessera_cli::announce(&format!("registered as {announced}, data on {addr}"))
            },
            tessera_cli::terminated(),
        )
        .await
        .map_err(anyhow::Error::from)
    })
}
