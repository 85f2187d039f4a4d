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
}

fn main() -> std::process::ExitCode {
    tessera_cli::tune_allocator();
    tessera_worker::crash::install();
    tessera_cli::init_tracing();
    tessera_cli::exit(run(Args::parse()))
}

fn run(args: Args) -> Result<()> {
    let mut config = CoordinatorConfig::load(args.config.as_deref(), |k| std::env::var(k).ok())?;
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    let identity =
        tessera_net::certs::load_identity(&config.certs, &config.name).with_context(|| {
            format!(
                "the coordinator's certificate '{}' in {}",
                config.name,
                config.certs.display()
            )
        })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    runtime.block_on(async move {
        let coordinator = Coordinator::open(config.clone(), &identity).await?;
        let serving = coordinator.clone();
        let served = tokio::spawn(async move { serving.serve().await });
        let front_door = tessera_cli::front_door::of_coordinator(&coordinator, &config, &identity)
            .await
            .context("the coordinator's front door")?;
        if let Some(door) = &front_door {
            for (what, addr) in [("HTTP", door.http_addr()), ("gRPC", door.grpc_addr())] {
                if let Some(addr) = addr {
                    tracing::info!(%addr, "front door: {what}");
                }
            }
        }
        tessera_cli::announce(&format!("listening on {}", coordinator.local_addr()?));
        tokio::select! {
            _ = served => {
                if let Some(why) = coordinator.stepped_down() {
                    anyhow::bail!("stepped down: {why}");
                }
            }
            () = tessera_cli::terminated() => {
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
