//! `tessera-serving`: the front door. KServe v2 (the Open Inference
//! Protocol) over HTTP and gRPC, and OpenAI-style generation over HTTP,
//! served by any process of the cluster: the coordinator, a worker
//! (`worker --http-listen`), or a gateway (`tessera serve`). A front door
//! is a requester like the SDK: it follows each model's routing table and
//! sends requests straight to the workers with its own certificate
//! ([`tessera_client`]); only model control (load, unload, the repository
//! index) goes to the coordinator. Every front door has the same rules
//! (tokens, TLS, limits, model control confined to a model repository)
//! and its own metrics.
//!
//! Layout: this file (the front door and its start), [`core`] (the
//! protocol-neutral KServe core: models, metadata, readiness, inference,
//! model control, generation), [`http`] and [`grpc`] (thin codecs over the
//! core), [`rules`] (who may call and what), [`auth`], [`tokens`],
//! [`control`] (model control), [`confine`] (the model repository), [`listener`] (connections: TLS,
//! limits), [`metrics`], [`error`], [`views`] and [`live`] (the cluster
//! page's JSON documents; the page itself is [`http::page`]).

pub mod auth;
pub mod confine;
pub mod control;
pub mod core;
pub mod error;
pub mod grpc;
pub mod http;
pub mod listener;
pub mod live;
pub mod metrics;
pub mod rules;
pub mod tokens;
pub mod views;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use tessera_client::{Client, Network};

pub use error::ServeError;
pub use rules::{Rules, SetupError};

/// What bounds one request at a front door.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest body (HTTP) or message (gRPC), bytes.
    pub max_body_bytes: u64,
    /// A request's deadline unless it sets one (retries included), and
    /// how long its body may take to arrive.
    pub request_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::of(&tessera_common::serving::FrontDoorConfig::default())
    }
}

impl Limits {
    /// A front door's limits as its configuration sets them.
    pub fn of(config: &tessera_common::serving::FrontDoorConfig) -> Limits {
        Limits {
            max_body_bytes: config.http_max_body_bytes,
            request_deadline: Duration::from_millis(config.request_deadline_ms),
        }
    }
}

/// Prometheus text another part of the process adds to `/metrics` (the
/// coordinator's cluster metrics).
pub type ExtraMetrics = Box<dyn Fn() -> String + Send + Sync>;

/// A front door: its requester, rules, limits and metrics.
pub struct Door {
    pub client: Client,
    pub rules: Rules,
    pub limits: Limits,
    pub metrics: metrics::Metrics,
    /// Named models' networks, each following its routing table.
    networks: DashMap<String, Network>,
    /// The cluster as last seen (readiness while the coordinator is
    /// away).
    seen: Mutex<Option<core::Seen>>,
    /// The page's live figures.
    live: Mutex<live::Live>,
    /// The workers seen, to list those that left as lost.
    roster: Mutex<views::Roster>,
    closing: tokio::sync::watch::Sender<bool>,
    extra_metrics: Option<ExtraMetrics>,
}

/// A running front door.
#[derive(Clone)]
pub struct FrontDoor {
    door: Arc<Door>,
    http: Option<SocketAddr>,
    grpc: Option<SocketAddr>,
}

impl FrontDoor {
    /// Starts serving on the listeners given (HTTP, gRPC), with `client`
    /// as the requester. Must run inside a tokio runtime.
    pub fn start(
        client: Client,
        rules: Rules,
        limits: Limits,
        http: Option<tokio::net::TcpListener>,
        grpc: Option<tokio::net::TcpListener>,
        extra_metrics: Option<ExtraMetrics>,
    ) -> FrontDoor {
        let door = Arc::new(Door {
            client,
            rules,
            limits,
            metrics: metrics::Metrics::new(),
            networks: DashMap::new(),
            seen: Mutex::new(None),
            live: Mutex::new(live::Live::new(std::time::Instant::now())),
            roster: Mutex::new(views::Roster::default()),
            closing: tokio::sync::watch::Sender::new(false),
            extra_metrics,
        });
        let addr =
            |l: &Option<tokio::net::TcpListener>| l.as_ref().and_then(|l| l.local_addr().ok());
        let (http_addr, grpc_addr) = (addr(&http), addr(&grpc));
        let listening: Vec<(&str, SocketAddr)> = [("HTTP", http_addr), ("gRPC", grpc_addr)]
            .into_iter()
            .filter_map(|(what, a)| Some((what, a?)))
            .collect();
        rules::warn_if_open(&listening, &door.rules);
        if let Some(listener) = http {
            tokio::spawn(http::serve(door.clone(), listener));
        }
        if let Some(listener) = grpc {
            tokio::spawn(grpc::serve(door.clone(), listener));
        }
        tokio::spawn(rules::reload_tokens_on_sighup(door.clone()));
        tokio::spawn(core::watch_cluster(door.clone()));
        FrontDoor {
            door,
            http: http_addr,
            grpc: grpc_addr,
        }
    }

    /// The HTTP listener's address, if any.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http
    }

    /// The gRPC listener's address, if any.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc
    }

    pub fn door(&self) -> &Arc<Door> {
        &self.door
    }

    /// Stops serving: the listeners close their connections.
    pub fn shutdown(&self) {
        self.door.closing.send_replace(true);
    }
}

impl Door {
    /// Waits until the front door shuts down.
    pub async fn closed(&self) {
        let mut closing = self.closing.subscribe();
        let _ = closing.wait_for(|c| *c).await;
    }

    /// `/metrics`: the front door's, and the process's others.
    pub fn render_metrics(&self) -> String {
        let mut text = self.metrics.render();
        if let Some(extra) = &self.extra_metrics {
            text.push_str(&extra());
        }
        text
    }
}
