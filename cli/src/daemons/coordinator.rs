//! `coordinator --config cluster.toml`: the cluster's coordinator. Prints
//! `listening on ADDR` once bound, then serves until interrupted.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use tessera_coordinator::config::CoordinatorConfig;
use tessera_coordinator::Coordinator;

#[derive(Parser)]
#[command(name = "coordinator", version, about = "Tessera's coordinator")]
struct Args {
    /// TOML configuration (keys: configs/cluster.toml); TESSERA_<KEY>
    /// environment variables override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override `listen`.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Check the configuration (the file, TESSERA_* variables: an unknown
    /// one is an error here, a warning at start) and the certificate and
    /// tokens file it names, print the settings as JSON and exit without
    /// serving.
    #[arg(long)]
    check_config: bool,
}

/// The program: parses its arguments, runs, and says how it ended.
pub fn main() -> std::process::ExitCode {
    crate::tune_allocator();
    tessera_worker::crash::install();
    crate::init_tracing();
    crate::exit(run(Args::parse()))
}

fn run(args: Args) -> Result<()> {
    let mut config = CoordinatorConfig::load(args.config.as_deref(), |k| std::env::var(k).ok())?;
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    let unknown = CoordinatorConfig::unknown_env(
        std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| !crate::PROCESS_ENV.contains(&k.as_str())),
    );
    if !unknown.is_empty() {
        let text = format!(
            "unknown environment variables {} (TESSERA_<KEY>, TESSERA_SERVING_<KEY>, \
             TESSERA_HA_<KEY> for the keys of configs/cluster.toml)",
            unknown.join(", ")
        );
        if args.check_config {
            anyhow::bail!(text);
        }
        tracing::warn!("{text}");
    }
    let identity =
        tessera_net::certs::load_identity(&config.certs, &config.name).with_context(|| {
            format!(
                "the coordinator's certificate '{}' in {}",
                config.name,
                config.certs.display()
            )
        })?;
    if args.check_config {
        return check_config(&config);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(async move {
        let coordinator = Coordinator::open(config.clone(), &identity).await?;
        let serving = coordinator.clone();
        let served = tokio::spawn(async move { serving.serve().await });
        let front_door = crate::front_door::of_coordinator(&coordinator, &config, &identity)
            .await
            .context("the coordinator's front door")?;
        if let Some(door) = &front_door {
            for (what, addr) in [("HTTP", door.http_addr()), ("gRPC", door.grpc_addr())] {
                if let Some(addr) = addr {
                    tracing::info!(%addr, "front door: {what}");
                }
            }
        }
        crate::announce(&format!("listening on {}", coordinator.local_addr()?));
        tokio::select! {
            _ = served => {
                if let Some(why) = coordinator.stepped_down() {
                    anyhow::bail!("stepped down: {why}");
                }
            }
            () = crate::terminated() => {
                tracing::info!("closing connections");
                if let Some(door) = &front_door {
                    door.shutdown();
                }
                coordinator.shutdown().await;
            }
        }
        Ok(())
    })
}

/// `--check-config`: what the loaded configuration names exists and
/// parses; prints the settings a deployment check compares (listeners,
/// paths, HA) as JSON.
fn check_config(config: &CoordinatorConfig) -> Result<()> {
    let serving = &config.front_door.serving;
    tessera_serving::Rules::check_files(serving)?;
    let repository = &serving.model_repository;
    let settings = serde_json::json!({
        "name": config.name,
        "cluster": config.cluster,
        "listen": config.listen.to_string(),
        "certs": config.certs,
        "state_dir": config.state_dir,
        "http_listen": config.front_door.http_listen,
        "grpc_listen": config.front_door.grpc_listen,
        "tokens_file": serving.tokens_file,
        "model_control": serving.model_control,
        "model_repository": repository,
        "models": config.models.keys().collect::<Vec<_>>(),
        "ha": {
            "etcd": config.ha.etcd,
            "advertise": config.ha.advertise,
            "lease_ttl_s": config.ha.lease_ttl_s,
            "prefix": config.ha.prefix,
        },
    });
    crate::announce(&format!("{settings:#}"));
    Ok(())
}
