//! `worker --devices CPU [--name node-a] [--listen ADDR] [--coordinator
//! ADDR] [--config worker.toml]`: serves this machine's devices to a
//! cluster. Prints `registered as NAME, data on ADDR` once registered.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::front_door::Settings;
use anyhow::{bail, Context, Result};
use clap::Parser;
use tessera_common::wire::handshake::Role;
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
    /// The coordinator's address (`host:port`, e.g. coordinator:7400); with
    /// HA, every coordinator's, comma-separated (a:7400,b:7400).
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
    /// Where compiled subgraphs and received weights are kept (default:
    /// `$TESSERA_CACHE_DIR/worker/NAME`, else under `$XDG_CACHE_HOME` or
    /// `~/.cache`): a deploy of any cut of a model seen before asks for no
    /// weight bytes.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Keep nothing on disk: every deploy receives its whole model.
    #[arg(long, conflicts_with = "cache_dir")]
    no_cache: bool,
    /// A directory this worker may read models from (repeatable): a model
    /// the coordinator read from a path under it, or a client loaded from
    /// a file or folder of the same name as one in it, is read here, and
    /// only the weights it lacks (checked by SHA-256) cross the network.
    #[arg(long = "models-dir", value_name = "DIR")]
    models_dirs: Vec<PathBuf>,
    /// The most each of the two caches (compiled subgraphs, weights)
    /// keeps, the least recently used going first (default 16GiB).
    #[arg(long, value_name = "SIZE")]
    cache_limit: Option<String>,
    /// The most memory each device offers for models: a size (64MiB,
    /// 2GiB) for every device, or KIND=SIZE pairs (CPU=2GiB,GPU=8GiB).
    /// Without it a CPU device offers the machine's available memory and a
    /// GPU what its adapter reports.
    #[arg(long, value_name = "SIZE")]
    memory_limit: Option<MemoryLimits>,
    /// Memory kept back from the CPU's (its --memory-limit, or what the
    /// machine has available) for the worker process itself, e.g. 384MiB:
    /// with --memory-limit at a container's limit, the planner never
    /// places more than the container may use.
    #[arg(long, value_name = "SIZE")]
    memory_reserve: Option<String>,
    /// The CPU backend: auto (onnxruntime where its library loads, else
    /// tract), tract or onnxruntime.
    #[arg(long)]
    cpu_backend: Option<CpuBackend>,
    /// onnxruntime's shared library (libonnxruntime.so.1.32.0).
    #[arg(long)]
    onnxruntime_library: Option<PathBuf>,
    /// Serve a front door here: KServe v2 over HTTP and OpenAI
    /// (`IP:PORT`); requests go from it straight to the workers.
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<SocketAddr>,
    /// The front door's KServe v2 over gRPC (`IP:PORT`).
    #[arg(long, value_name = "ADDR")]
    grpc_listen: Option<SocketAddr>,
    /// Seconds what is deployed here keeps serving after the coordinator
    /// is lost, waiting for one to adopt it (default 300); then it is
    /// unloaded.
    #[arg(long, value_name = "SECONDS")]
    adopt_grace_s: Option<f64>,
    /// Stopped (SIGTERM) with deployments here, the longest it keeps
    /// serving while the coordinator moves them elsewhere (default 20; 0:
    /// stop at once, their requests retried by their requesters).
    #[arg(long, value_name = "SECONDS")]
    drain_timeout_s: Option<f64>,
    /// Check the flags and --config, and the certificate and tokens file
    /// they name, print the settings as JSON and exit without serving.
    #[arg(long)]
    check_config: bool,
}

/// The program: parses its arguments, runs, and says how it ended.
pub fn main() -> std::process::ExitCode {
    crate::tune_allocator();
    tessera_worker::crash::install();
    crate::quiet_vulkan_device_select();
    crate::init_tracing();
    crate::exit(run(Args::parse()))
}

fn parse_addr(what: &str, text: &str) -> Result<SocketAddr> {
    text.parse()
        .with_context(|| format!("{what}: '{text}' is not an address like 127.0.0.1:7400"))
}

/// The flags that shape how subgraphs compute.
struct ComputeFlags {
    cpu_backend: Option<CpuBackend>,
    threads: Option<usize>,
    memory_limit: Option<MemoryLimits>,
    memory_reserve: Option<String>,
    onnxruntime_library: Option<PathBuf>,
}

/// Where the worker keeps compiled subgraphs and weights (none with
/// `--no-cache`; default: under Tessera's cache folder, by worker name),
/// and each cache's bound.
fn cache_settings(
    no_cache: bool,
    dir: Option<PathBuf>,
    limit: Option<String>,
    name: &str,
) -> Result<(Option<PathBuf>, u64)> {
    let dir = match no_cache {
        true => None,
        false => dir.or_else(|| {
            tessera_gguf::cache::cache_root().map(|root| root.join("worker").join(name))
        }),
    };
    let limit = match limit {
        Some(text) => tessera_common::memory::parse_size(&text)
            .with_context(|| format!("cache_limit '{text}'"))?,
        None => tessera_worker::daemon::cache::DEFAULT_LIMIT,
    };
    Ok((dir, limit))
}

/// Configures the plugins (the CPU backend, onnxruntime's library, where
/// the CPU calibration is kept) from the flags and worker.toml's
/// `[plugin]` table; returns the configuration for every compile and the
/// devices' memory limits.
fn compute_settings(
    flags: ComputeFlags,
    mut plugin: std::collections::BTreeMap<String, String>,
    memory: (Option<&str>, Option<&str>),
    cache_dir: Option<PathBuf>,
) -> Result<(Vec<(String, String)>, MemoryLimits)> {
    let (memory_limit, memory_reserve) = memory;
    let cpu_backend = match (flags.cpu_backend, plugin.remove("backend")) {
        (Some(b), _) => b,
        (None, Some(text)) => text
            .parse()
            .map_err(anyhow::Error::msg)
            .context("[plugin] backend")?,
        (None, None) => CpuBackend::Auto,
    };
    plugins::configure(PluginOptions {
        cpu_backend,
        onnxruntime_library: flags.onnxruntime_library,
        // What it measured of its CPU is kept with its compile cache.
        calibration_dir: cache_dir,
    });
    let mut config: Vec<(String, String)> = plugin.into_iter().collect();
    if let Some(t) = flags.threads {
        config.push(("NUM_THREADS".into(), t.to_string()));
    }
    let memory_limit = match (flags.memory_limit, memory_limit) {
        (Some(l), _) => l,
        (None, Some(text)) => text
            .parse()
            .map_err(anyhow::Error::msg)
            .context("memory_limit in the worker's config")?,
        (None, None) => MemoryLimits::default(),
    };
    let memory_limit = match flags.memory_reserve.as_deref().or(memory_reserve) {
        Some(text) => {
            let reserve = tessera_common::memory::parse_limit(text)
                .map_err(anyhow::Error::msg)
                .context("memory_reserve")?;
            memory_limit.reserving(reserve)?
        }
        None => memory_limit,
    };
    Ok((config, memory_limit))
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
    let (cache_dir, cache_limit) = cache_settings(
        args.no_cache,
        args.cache_dir.or(file.cache_dir),
        args.cache_limit.or(file.cache_limit),
        &name,
    )?;
    let (config, memory_limit) = compute_settings(
        ComputeFlags {
            cpu_backend: args.cpu_backend,
            threads: args.threads,
            memory_limit: args.memory_limit,
            memory_reserve: args.memory_reserve,
            onnxruntime_library: args.onnxruntime_library.or(file.onnxruntime_library),
        },
        file.plugin,
        (file.memory_limit.as_deref(), file.memory_reserve.as_deref()),
        cache_dir.clone(),
    )?;
    let (adopt_grace, drain_timeout) = timings(
        args.adopt_grace_s.or(file.adopt_grace_s),
        args.drain_timeout_s.or(file.drain_timeout_s),
    )?;
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
        cache_limit,
        models_dirs: if args.models_dirs.is_empty() {
            file.models_dirs.unwrap_or_default()
        } else {
            args.models_dirs
        },
        config,
        memory_limit,
        adopt_grace,
        drain_timeout,
    };
    let identity = tessera_net::certs::load_identity(&certs, &name)
        .with_context(|| format!("the certificate of '{name}' in {}", certs.display()))?;
    let front_door = Settings::of(
        &file
            .front_door
            .with_listeners(args.http_listen, args.grpc_listen),
        certs.join(format!("{name}.pem")),
    )?;
    if args.check_config {
        return check_config(&options, &certs, &front_door);
    }
    serve(options, identity, front_door)
}

/// Runs the worker and its front door until SIGTERM.
fn serve(
    options: WorkerOptions,
    identity: tessera_net::certs::NodeIdentity,
    front_door: Settings,
) -> Result<()> {
    crate::cluster::run_system(async move {
        let announced = options.name.clone();
        let (registered, first) = tokio::sync::oneshot::channel::<()>();
        let door = tokio::spawn(serve_front_door(
            options.coordinator.clone(),
            identity.clone(),
            options.cluster.clone(),
            front_door,
            first,
        ));
        let outcome = daemon::run_until(
            options,
            &identity,
            move |addr: &str| {
                crate::announce(&format!("registered as {announced}, data on {addr}"));
                let _ = registered.send(());
            },
            crate::terminated(),
        )
        .await
        .map_err(anyhow::Error::from);
        door.abort();
        outcome
    })
}

/// How long deployments outlive the coordinator (`adopt_grace_s`) and
/// how long a stopped worker drains (`drain_timeout_s`).
fn timings(
    adopt_grace_s: Option<f64>,
    drain_timeout_s: Option<f64>,
) -> Result<(std::time::Duration, std::time::Duration)> {
    Ok((
        seconds("adopt_grace_s", adopt_grace_s, daemon::ADOPT_GRACE)?,
        seconds("drain_timeout_s", drain_timeout_s, daemon::DRAIN_TIMEOUT)?,
    ))
}

/// A duration in seconds, `default` when unset.
fn seconds(
    key: &str,
    seconds: Option<f64>,
    default: std::time::Duration,
) -> Result<std::time::Duration> {
    match seconds {
        Some(s) if s.is_finite() && s >= 0.0 => Ok(std::time::Duration::from_secs_f64(s)),
        Some(s) => bail!("{key}: {s} is not a number of seconds >= 0"),
        None => Ok(default),
    }
}

/// Starts the worker's front door once it has registered (its
/// coordinator answers), and keeps it until the worker stops.
async fn serve_front_door(
    coordinator: String,
    identity: tessera_net::certs::NodeIdentity,
    cluster: String,
    settings: Settings,
    registered: tokio::sync::oneshot::Receiver<()>,
) {
    if !settings.any() || registered.await.is_err() {
        return;
    }
    let started = async {
        let addrs = crate::resolve_coordinators(&coordinator).await?;
        crate::front_door::start(&addrs, &identity, &cluster, Role::Worker, &settings, None).await
    };
    match started.await {
        Ok(Some(door)) => {
            for (what, addr) in [("HTTP", door.http_addr()), ("gRPC", door.grpc_addr())] {
                if let Some(addr) = addr {
                    crate::announce(&format!("front door: {what} on {addr}"));
                }
            }
            std::future::pending::<()>().await;
        }
        Ok(None) => {}
        Err(e) => tracing::error!(
            "the worker's front door did not start: {}",
            crate::error_line(&e)
        ),
    }
}

/// `--check-config`: the devices are ones this build serves and the
/// front door's tokens file parses; prints the settings a deployment
/// check compares (listeners, paths, the memory the planner may use) as
/// JSON.
fn check_config(options: &WorkerOptions, certs: &std::path::Path, door: &Settings) -> Result<()> {
    for kind in &options.devices {
        let known = plugins::BACKENDS
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case(kind));
        anyhow::ensure!(known, "device kind '{kind}' is unknown");
    }
    tessera_serving::Rules::check_files(&door.serving)?;
    let tokens_file = &door.serving.tokens_file;
    let offered: serde_json::Map<String, serde_json::Value> = options
        .devices
        .iter()
        .map(|kind| {
            let kind = kind.to_ascii_uppercase();
            let reported = (kind == "CPU").then(daemon::available_memory).flatten();
            let bytes = options.memory_limit.offered(&kind, reported);
            (kind, serde_json::json!(bytes))
        })
        .collect();
    let settings = serde_json::json!({
        "name": options.name,
        "cluster": options.cluster,
        "devices": options.devices,
        "listen": options.listen.to_string(),
        "advertise": options.advertise,
        "coordinators": options.coordinator.split(',').map(str::trim).collect::<Vec<_>>(),
        "certs": certs,
        "cache_dir": options.cache_dir,
        "models_dirs": options.models_dirs,
        "http_listen": door.http.map(|a| a.to_string()),
        "grpc_listen": door.grpc.map(|a| a.to_string()),
        "tokens_file": tokens_file,
        "memory_offered": offered,
    });
    crate::announce(&format!("{settings:#}"));
    Ok(())
}
