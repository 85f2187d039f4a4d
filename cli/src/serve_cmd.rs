//! `tessera serve`: a gateway, a front door of its own (KServe v2 over
//! HTTP and gRPC, OpenAI) in front of a running cluster. It is a
//! requester with a client certificate: it follows each model's routing
//! table from the coordinator and sends requests straight to the workers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use tessera_cli::front_door::Settings;
use tessera_common::serving::{unknown_keys, FrontDoorConfig, FRONT_DOOR_KEYS, SERVING_TABLE};
use tessera_common::wire::handshake::Role;

#[derive(Args)]
pub struct ServeArgs {
    /// The cluster's coordinator.
    #[arg(long, value_name = "ADDR")]
    coordinator: String,
    /// Directory made by `tessera certs init`.
    #[arg(long, default_value = "certs")]
    certs: PathBuf,
    /// This gateway's name: its certificate is `<certs>/<name>.pem`.
    #[arg(long, default_value = "client")]
    name: String,
    /// The cluster's name.
    #[arg(long, default_value = "tessera")]
    cluster: String,
    /// KServe v2 over HTTP and OpenAI on this address.
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<SocketAddr>,
    /// KServe v2 over gRPC on this address.
    #[arg(long, value_name = "ADDR")]
    grpc_listen: Option<SocketAddr>,
    /// TOML with the front door's keys: http_listen, grpc_listen,
    /// http_max_body_bytes, request_deadline_ms and a `[serving]` table.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// The gateway's TOML file: a front door's keys and nothing else.
fn gateway_config(path: &std::path::Path) -> Result<FrontDoorConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let built = ::config::Config::builder()
        .add_source(::config::File::from_str(&text, ::config::FileFormat::Toml))
        .build()
        .with_context(|| format!("{}", path.display()))?;
    let top: BTreeMap<String, ::config::Value> = built
        .clone()
        .try_deserialize()
        .with_context(|| format!("{}", path.display()))?;
    let unknown = unknown_keys(
        top.keys().map(String::as_str),
        &[&FRONT_DOOR_KEYS, &[SERVING_TABLE]],
    );
    if !unknown.is_empty() {
        bail!(
            "{}: unknown key {} (known keys: {}, [serving])",
            path.display(),
            unknown.join(", "),
            FRONT_DOOR_KEYS.join(", ")
        );
    }
    let config: FrontDoorConfig = built
        .try_deserialize()
        .with_context(|| format!("{}", path.display()))?;
    config
        .check()
        .with_context(|| format!("{}", path.display()))?;
    Ok(config)
}

fn settings(args: &ServeArgs) -> Result<Settings> {
    let file = match &args.config {
        Some(path) => gateway_config(path)?,
        None => FrontDoorConfig::default(),
    };
    let door = file.with_listeners(args.http_listen, args.grpc_listen);
    let settings = Settings::of(&door, args.certs.join(format!("{}.pem", args.name)))?;
    if !settings.any() {
        bail!("nothing to serve: give --http-listen ADDR or --grpc-listen ADDR");
    }
    Ok(settings)
}

pub fn serve(args: ServeArgs) -> Result<()> {
    let settings = settings(&args)?;
    let identity = tessera_net::certs::load_identity(&args.certs, &args.name)
        .context("the gateway's certificate (make one with `tessera certs init`)")?;
    tessera_cli::cluster::run_system(async move {
        let coordinators = tessera_cli::resolve_coordinators(&args.coordinator).await?;
        let door = tessera_cli::front_door::start(
            &coordinators,
            &identity,
            &args.cluster,
            Role::Client,
            &settings,
            None,
        )
        .await?
        .context("nothing to serve")?;
        for (what, addr) in [("HTTP", door.http_addr()), ("gRPC", door.grpc_addr())] {
            if let Some(addr) = addr {
                tessera_cli::announce(&format!("serving {what} on {addr}"));
            }
        }
        tessera_cli::terminated().await;
        door.shutdown();
        Ok(())
    })
}
