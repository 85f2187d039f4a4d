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
use tessera_common::affinity::Policy;
use tessera_common::schedule::Replicas;

/// Every key, for environment overrides and error messages.
pub const KEYS: [&str; 11] = [
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
];

/// The keys of the `[serving]` table (environment: `TESSERA_SERVING_<KEY>`).
pub const SERVING_KEYS: [&str; 7] = [
    "model_control",
    "model_repository",
    "tls",
    "tls_cert",
    "tls_key",
    "tokens_file",
    "header_timeout_ms",
];

/// How the HTTP and gRPC listeners let callers in: `[serving]`.
///
/// ```toml
/// [serving]
/// model_control = true          # load/unload over HTTP and gRPC (default: 403)
/// model_repository = "models"   # loads by name: models/NAME.onnx or models/NAME/model.onnx
/// tls = true                    # HTTPS and gRPC over TLS (the coordinator's cluster certificate)
/// tokens_file = "tokens.txt"    # Authorization: Bearer TOKEN on every endpoint but liveness
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServingConfig {
    /// Whether HTTP and gRPC callers may load and unload models (the
    /// cluster's own clients, over QUIC with their certificates, always
    /// may).
    pub model_control: bool,
    /// The folder HTTP and gRPC loads are confined to (empty: only the
    /// `[models.NAME]` tables can be loaded).
    pub model_repository: PathBuf,
    /// Serve HTTPS (and gRPC over TLS) instead of plain HTTP.
    pub tls: bool,
    /// A PEM certificate chain of the user's for TLS (empty: the
    /// coordinator's cluster certificate, `<certs>/<name>.pem`).
    pub tls_cert: PathBuf,
    /// The PEM private key of `tls_cert`.
    pub tls_key: PathBuf,
    /// One bearer token per line (`#` comments); when set, every endpoint
    /// but liveness wants `Authorization: Bearer TOKEN`. Re-read when the
    /// file changes and on SIGHUP.
    pub tokens_file: PathBuf,
    /// A connection that has not sent a whole request head (or finished
    /// its TLS handshake) this long after it opened or after its last
    /// request is closed (slow-loris clients).
    pub header_timeout_ms: u64,
}

/// How long a connection may take to send a request head by default.
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;

impl Default for ServingConfig {
    fn default() -> Self {
        ServingConfig {
            model_control: false,
            model_repository: PathBuf::new(),
            tls: false,
            tls_cert: PathBuf::new(),
            tls_key: PathBuf::new(),
            tokens_file: PathBuf::new(),
            header_timeout_ms: DEFAULT_HEADER_TIMEOUT_MS,
        }
    }
}

/// A named model of the repository: `[models.NAME]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The ONNX file (relative paths from the working directory, like
    /// `certs`), or a generative model's folder (`model.onnx` and its
    /// external data, `tokenizer.json`, `tokenizer_config.json`,
    /// `genai_config.json`): it then generates text (`/v1/completions`).
    /// Over HTTP and gRPC, relative to `[serving] model_repository` (and
    /// found there by the model's name when not given).
    #[serde(default)]
    pub path: PathBuf,
    /// Device priority, e.g. `HETERO:node-a/CPU,node-b/CPU` (empty: every
    /// device of every worker).
    #[serde(default)]
    pub devices: String,
    /// `priority` or `cost`.
    #[serde(default)]
    pub policy: Policy,
    /// Refuse a plan that leaves a node without a device.
    #[serde(default)]
    pub strict: bool,
    /// Concrete shapes of graph inputs: `{ x = [1, 3, 48, 320] }`.
    #[serde(default)]
    pub shapes: BTreeMap<String, Vec<u64>>,
    /// Manual affinity: node name → `host/DEVICE`.
    #[serde(default)]
    pub affinity: BTreeMap<String, String>,
    /// Copies to run: a number or `auto`.
    #[serde(default, deserialize_with = "number_or_auto")]
    pub replicas: Replicas,
    /// Dynamic batching: the most requests run as one batch (0 or 1: off).
    #[serde(default)]
    pub max_batch: u32,
    /// How long a request waits for others to join its batch, µs.
    #[serde(default = "default_queue_delay_us")]
    pub max_queue_delay_us: u64,
    /// A generative model: sequences each stage keeps state for at once.
    #[serde(default = "default_max_sequences")]
    pub max_sequences: u32,
    /// A generative model: positions one sequence may hold (0: the
    /// model's context, at most 2048).
    #[serde(default)]
    pub context: u32,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            path: PathBuf::new(),
            devices: String::new(),
            policy: Policy::default(),
            strict: false,
            shapes: BTreeMap::new(),
            affinity: BTreeMap::new(),
            replicas: Replicas::default(),
            max_batch: 0,
            max_queue_delay_us: DEFAULT_QUEUE_DELAY_US,
            max_sequences: DEFAULT_MAX_SEQUENCES,
            context: 0,
        }
    }
}

/// Sequences a generative model's stages keep state for unless told.
pub const DEFAULT_MAX_SEQUENCES: u32 = 4;

fn default_max_sequences() -> u32 {
    DEFAULT_MAX_SEQUENCES
}

/// `replicas = 2` or `replicas = "auto"` (also `"2"`).
fn number_or_auto<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Replicas, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Setting {
        Number(u64),
        Name(String),
    }
    let text = match Setting::deserialize(d)? {
        Setting::Number(n) => n.to_string(),
        Setting::Name(s) => s,
    };
    text.parse().map_err(serde::de::Error::custom)
}

/// The keys of a `[models.NAME]` table.
pub const MODEL_KEYS: [&str; 11] = [
    "path",
    "devices",
    "policy",
    "strict",
    "shapes",
    "affinity",
    "replicas",
    "max_batch",
    "max_queue_delay_us",
    "max_sequences",
    "context",
];

/// How long a request waits for others to join its batch by default, µs.
pub const DEFAULT_QUEUE_DELAY_US: u64 = 500;

fn default_queue_delay_us() -> u64 {
    DEFAULT_QUEUE_DELAY_US
}

/// What is wrong with a model's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ModelConfigError {
    #[error("a model name is 1-128 of A-Z a-z 0-9 _ . - (not starting with '.')")]
    BadName,
    #[error("the model's file (or generative folder) is required")]
    NoPath,
}

impl ModelConfigError {
    /// The key at fault below `models.NAME` (`""`: the name itself).
    pub fn key(&self) -> &'static str {
        match self {
            ModelConfigError::BadName => "",
            ModelConfigError::NoPath => ".path",
        }
    }

    /// The error as a config file shows it: `models.NAME.key: why`.
    pub fn at(&self, name: &str) -> String {
        format!("models.{name}{}: {self}", self.key())
    }
}

impl ModelConfig {
    /// Checks the model's name and that it has a path.
    pub fn check(&self, name: &str) -> Result<(), ModelConfigError> {
        if !valid_model_name(name) {
            return Err(ModelConfigError::BadName);
        }
        if self.path.as_os_str().is_empty() {
            return Err(ModelConfigError::NoPath);
        }
        Ok(())
    }
}

/// Whether `name` can name a model in URLs and metrics: 1–128 of
/// `[A-Za-z0-9_.-]`, not starting with a dot.
pub fn valid_model_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

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
    /// Who may do what over HTTP and gRPC.
    pub serving: ServingConfig,
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
            serving: ServingConfig::default(),
            models: BTreeMap::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("configuration {origin}: {reason}")]
pub struct ConfigError {
    pub origin: String,
    pub reason: String,
}

impl CoordinatorConfig {
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
        for key in KEYS {
            let var = format!("TESSERA_{}", key.to_uppercase());
            if let Some(value) = env(&var) {
                builder = builder
                    .set_override(key, value)
                    .map_err(|e| err(format!("{var}: {e}")))?;
            }
        }
        for key in SERVING_KEYS {
            let var = format!("TESSERA_SERVING_{}", key.to_uppercase());
            if let Some(value) = env(&var) {
                builder = builder
                    .set_override(format!("serving.{key}"), value)
                    .map_err(|e| err(format!("{var}: {e}")))?;
            }
        }
        let built = builder.build().map_err(|e| err(e.to_string()))?;
        let cfg: CoordinatorConfig = built.try_deserialize().map_err(|e| {
            let text = e.to_string();
            if text.contains("unknown field") {
                err(format!(
                    "{text} (known keys: {}; [serving]: {})",
                    KEYS.join(", "),
                    SERVING_KEYS.join(", ")
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
