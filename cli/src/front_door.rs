//! Starting a front door (`tessera-serving`: KServe v2 over HTTP and gRPC,
//! OpenAI) in a process: the coordinator's, a worker's or a gateway's
//! (`tessera serve`). Each is a requester of the cluster with the process's
//! own certificate: it connects to the coordinator for routing tables and
//! model control, and sends requests straight to the workers.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use tessera_client::Client;
use tessera_common::backoff::Backoff;
use tessera_common::serving::{FrontDoorConfig, ServingConfig};
use tessera_common::wire::handshake::Role;
use tessera_net::certs::NodeIdentity;
use tessera_serving::{ExtraMetrics, FrontDoor, Limits, Rules};

/// Where and how a front door serves.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub http: Option<SocketAddr>,
    pub grpc: Option<SocketAddr>,
    pub serving: ServingConfig,
    /// The process's certificate file (what `tls = true` serves with,
    /// unless `[serving]` names the user's).
    pub cert_path: PathBuf,
    pub limits: Limits,
}

impl Settings {
    /// The settings of a front door configured by `config` (the one
    /// mapping for the coordinator's, a worker's and a gateway's), serving
    /// with the certificate at `cert_path`.
    pub fn of(config: &FrontDoorConfig, cert_path: PathBuf) -> Result<Settings> {
        Ok(Settings {
            http: config.http_addr()?,
            grpc: config.grpc_addr()?,
            serving: config.serving.clone(),
            cert_path,
            limits: Limits::of(config),
        })
    }

    /// Whether there is anything to serve.
    pub fn any(&self) -> bool {
        self.http.is_some() || self.grpc.is_some()
    }
}

/// Binds a listener of `what` at `addr` (port 0: any free port).
fn bind(what: &'static str, addr: Option<SocketAddr>) -> Result<Option<tokio::net::TcpListener>> {
    addr.map(|a| tessera_serving::listener::bind(what, a).map_err(anyhow::Error::from))
        .transpose()
}

/// Starts a front door that reaches the cluster at `coordinator` as
/// `identity` (whose certificate is of `role`), on the listeners
/// `settings` names; `None` when it names none.
pub async fn start(
    coordinators: &[SocketAddr],
    identity: &NodeIdentity,
    cluster: &str,
    role: Role,
    settings: &Settings,
    extra_metrics: Option<ExtraMetrics>,
) -> Result<Option<FrontDoor>> {
    if !settings.any() {
        return Ok(None);
    }
    let rules = Rules::from_config(&settings.serving, identity, &settings.cert_path)?;
    let http = bind("HTTP", settings.http)?;
    let grpc = bind("gRPC", settings.grpc)?;
    let client = connect(coordinators, identity, cluster, role).await?;
    Ok(Some(FrontDoor::start(
        client,
        rules,
        settings.limits,
        http,
        grpc,
        extra_metrics,
    )))
}

/// The front door's requester: the coordinator dialled until it answers
/// (it may be starting too), for up to a minute.
async fn connect(
    coordinators: &[SocketAddr],
    identity: &NodeIdentity,
    cluster: &str,
    role: Role,
) -> Result<Client> {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    let started = std::time::Instant::now();
    loop {
        match Client::connect_any(coordinators, identity, cluster, role).await {
            Ok(client) => return Ok(client),
            Err(e) if started.elapsed() < Duration::from_secs(60) => {
                let wait = backoff.wait();
                tracing::debug!("the front door's coordinator: {e}; again in {wait:?}");
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e).context("the front door cannot reach the coordinator"),
        }
    }
}

/// The coordinator's own front door (its `http_listen`, `grpc_listen`,
/// limits and `[serving]`), a requester of its own cluster with the coordinator's
/// certificate; its `/metrics` adds the cluster's.
pub async fn of_coordinator(
    coordinator: &tessera_coordinator::Coordinator,
    config: &tessera_coordinator::config::CoordinatorConfig,
    identity: &NodeIdentity,
) -> Result<Option<FrontDoor>> {
    let cert_path = config.certs.join(format!("{}.pem", config.name));
    let settings = Settings::of(&config.front_door, cert_path)?;
    let mut addr = coordinator.local_addr()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let shared = coordinator.shared().clone();
    let cluster_metrics: ExtraMetrics = Box::new(move || shared.metrics.render());
    start(
        &[addr],
        identity,
        &config.cluster,
        Role::Coordinator,
        &settings,
        Some(cluster_metrics),
    )
    .await
}
