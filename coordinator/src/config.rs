//! The coordinator's configuration: a TOML file (every key documented in
//! `configs/cluster.toml`), each key overridable by an environment variable
//! `TESSERA_<KEY>` (e.g. `TESSERA_LISTEN=0.0.0.0:7400`). Unknown keys are
//! an error, not ignored.
//!
//! Named models (the model repository served over HTTP and loaded by name
//! through the SDK) are `[models.NAME]` tables:
//!
//! ```toml
//! [models.rec]
//! path = "models/rec.onnx"
//! devices = "HETERO:node-a/CPU,node-b/CPU"
//! policy = "priority"
//! replicas = 2            # or "auto"
//! max_batch = 8           # dynamic batching (0: off)
//! max_queue_delay_us = 500
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Every key, for environment overrides and error messages.
pub const KEYS: [&str; 12] = [
    "cluster",
    "name",
    "listen",
    "certs",
    "heartbeat_ms",
    "worker_timeout_ms",
    "request_deadline_ms",
    "inter_host_gbps",
    "http_listen",
    "http_max_body_bytes",
    "grpc_listen",
    "state_dir",
];

pub use crate::ha::config::{HaConfig, HA_KEYS};
pub use tessera_common::serving::{ServingConfig, DEFAULT_HEADER_TIMEOUT_MS, SERVING_KEYS};

pub use tessera_common::models::{
    valid_model_name, ModelConfig, ModelConfigError, DEFAULT_MAX_SEQUENCES, DEFAULT_QUEUE_DELAY_US,
    MODEL_KEYS,
};

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CoordinatorConfig {
    /// Cluster name: peers of another cluster are refused.
    pub cluster: String,
    /// This node's name (its certificate is `<certs>/<name>.pem`).
    pub name: String,
    /// QUIC address workers and clients dial.
    pub listen: SocketAddr,
    /// Directory made by `tessera certs init`.
    pub certs: PathBuf,
    /// How often workers send heartbeats.
    pub heartbeat_ms: u64,
    /// A worker silent this long is lost: its networks are re-planned onto
    /// the others and its requests retried there.
    pub worker_timeout_ms: u64,
    /// Deadline of a request whose client gives none.
    pub request_deadline_ms: u64,
    /// Network bandwidth between hosts assumed by the cost policy until the
    /// coordinator has measured it, GB/s (latency is always measured).
    pub inter_host_gbps: f64,
    /// Address of the HTTP listener (KServe v2 inference protocol and
    /// Prometheus `/metrics`); empty: no HTTP listener.
    pub http_listen: String,
    /// Largest HTTP request body (larger: 413) and largest gRPC message
    /// (larger: OUT_OF_RANGE) accepted.
    pub http_max_body_bytes: u64,
    /// Address of the gRPC listener (KServe v2 `GRPCInferenceService`);
    /// empty: none.
    pub grpc_listen: String,
    /// Where the coordinator keeps its state (the model repository with
    /// the bytes of models clients sent, networks, deployments, the epoch):
    /// a coordinator restarted with the same folder serves everything
    /// again and adopts what its workers still run. Empty: nothing is kept.
    pub state_dir: PathBuf,
    /// Who may do what over HTTP and gRPC.
    pub serving: ServingConfig,
    /// Two or more coordinators, one leading (`[ha]`; off by default).
    pub ha: HaConfig,
    /// The model repository: models loaded by name at start.
    pub models: BTreeMap<String, ModelConfig>,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            cluster: "tessera".into(),
            name: "coordinator".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 7400)),
            certs: PathBuf::from("certs"),
            heartbeat_ms: 500,
            worker_timeout_ms: 2000,
            request_deadline_ms: 30_000,
            inter_host_gbps: 1.0,
            http_listen: String::new(),
            http_max_body_bytes: 64 << 20,
            grpc_listen: String::new(),
            state_dir: PathBuf::new(),
            serving: ServingConfig::default(),
            ha: HaConfig::default(),
            models: BTreeMap::new(),
        }
    }
}

/// Every environment variable that sets a key, with the key's path:
/// `TESSERA_<KEY>`, `TESSERA_SERVING_<KEY>` (`serving.key`) and
/// `TESSERA_HA_<KEY>` (`ha.key`).
fn env_keys() -> impl Iterator<Item = (String, String)> {
    let tables: [(&str, &str, &[&str]); 3] = [
        ("TESSERA_", "", &KEYS),
        ("TESSERA_SERVING_", "serving.", &SERVING_KEYS),
        ("TESSERA_HA_", "ha.", &HA_KEYS),
    ];
    tables.into_iter().flat_map(|(prefix, section, keys)| {
        keys.iter().map(move |key| {
            (
                format!("{prefix}{}", key.to_uppercase()),
                format!("{section}{key}"),
            )
        })
    })
}

#[derive(Debug, thiserror::Error)]
#[error("configuration {origin}: {reason}")]
pub struct ConfigError {
    pub origin: String,
    pub reason: String,
}

impl CoordinatorConfig {
    /// The `TESSERA_*` names among `names` that set no key (a misspelt
    /// `TESSERA_HA_ETDC` would otherwise be ignored), sorted.
    pub fn unknown_env<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Vec<String> {
        let known: Vec<String> = env_keys().map(|(var, _)| var).collect();
        let mut unknown: Vec<String> = names
            .into_iter()
            .map(|n| n.as_ref().to_string())
            .filter(|n| n.starts_with("TESSERA_") && !known.contains(n))
            .collect();
        unknown.sort();
        unknown
    }

    /// Reads `path` (if given), then applies `TESSERA_<KEY>` variables from
    /// `env`.
    pub fn load(
        path: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<CoordinatorConfig, ConfigError> {
        let origin = path
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "(defaults)".into());
        let err = |reason: String| ConfigError {
            origin: origin.clone(),
            reason,
        };
        let mut builder = config::Config::builder();
        if let Some(path) = path {
            if !path.exists() {
                return Err(err("no such file".into()));
            }
            builder = builder.add_source(config::File::from(path).format(config::FileFormat::Toml));
        }
        for (var, key) in env_keys() {
            if let Some(value) = env(&var) {
                builder = builder
                    .set_override(key, value)
                    .map_err(|e| err(format!("{var}: {e}")))?;
            }
        }
        let built = builder.build().map_err(|e| err(e.to_string()))?;
        let cfg: CoordinatorConfig = built.try_deserialize().map_err(|e| {
            let text = e.to_string();
            if text.contains("unknown field") {
                err(format!(
                    "{text} (known keys: {}; [serving]: {}; [ha]: {})",
                    KEYS.join(", "),
                    SERVING_KEYS.join(", "),
                    HA_KEYS.join(", ")
                ))
            } else {
                err(text)
            }
        })?;
        if cfg.heartbeat_ms == 0 || cfg.worker_timeout_ms <= cfg.heartbeat_ms {
            return Err(err(format!(
                "worker_timeout_ms ({}) must exceed heartbeat_ms ({}) > 0",
                cfg.worker_timeout_ms, cfg.heartbeat_ms
            )));
        }
        if cfg.inter_host_gbps <= 0.0 {
            return Err(err("inter_host_gbps must be positive".into()));
        }
        cfg.http_addr().map_err(|e| err(e.to_string()))?;
        cfg.grpc_addr().map_err(|e| err(e.to_string()))?;
        if cfg.serving.tls_cert.as_os_str().is_empty() != cfg.serving.tls_key.as_os_str().is_empty()
        {
            return Err(err(
                "serving.tls_cert and serving.tls_key go together".into()
            ));
        }
        if cfg.serving.header_timeout_ms == 0 {
            return Err(err("serving.header_timeout_ms must be positive".into()));
        }
        if cfg.http_max_body_bytes == 0 {
            return Err(err("http_max_body_bytes must be positive".into()));
        }
        cfg.ha.check(cfg.listen).map_err(err)?;
        if cfg.ha.enabled() && cfg.state_dir.as_os_str().is_empty() {
            return Err(err(
                "[ha] needs state_dir: the model bytes clients send are kept \
                 there, on a volume every coordinator reads"
                    .into(),
            ));
        }
        for (name, model) in &cfg.models {
            model.check(name).map_err(|e| err(e.at(name)))?;
        }
        Ok(cfg)
    }

    /// The HTTP listener's address, `None` when off.
    pub fn http_addr(&self) -> Result<Option<SocketAddr>, ListenAddrError> {
        listen_addr("http_listen", &self.http_listen, 8000)
    }

    /// The gRPC listener's address, `None` when off.
    pub fn grpc_addr(&self) -> Result<Option<SocketAddr>, ListenAddrError> {
        listen_addr("grpc_listen", &self.grpc_listen, 8001)
    }
}

/// A listener key that is not `IP:PORT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} '{text}': {source} (expected IP:PORT, e.g. 127.0.0.1:{example})")]
pub struct ListenAddrError {
    pub key: &'static str,
    pub text: String,
    /// A port the example shows.
    pub example: u16,
    pub source: std::net::AddrParseError,
}

/// `IP:PORT` of a listener key, `None` when empty.
fn listen_addr(
    key: &'static str,
    text: &str,
    example: u16,
) -> Result<Option<SocketAddr>, ListenAddrError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|source| ListenAddrError {
        key,
        text: text.to_string(),
        example,
        source,
    })
}
