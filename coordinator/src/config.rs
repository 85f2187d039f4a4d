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

/// The coordinator's own keys, for environment overrides and error
/// messages (the front door's are [`FRONT_DOOR_KEYS`]).
pub const KEYS: [&str; 9] = [
    "cluster",
    "name",
    "listen",
    "certs",
    "heartbeat_ms",
    "worker_timeout_ms",
    "inter_host_gbps",
    "state_dir",
    "cache_dir",
];

/// The file's tables: the front door's `[serving]`, `[ha]` and
/// `[models.NAME]`.
const TABLES: [&str; 3] = [SERVING_TABLE, "ha", "models"];

pub use crate::ha::config::{HaConfig, HA_KEYS};
use tessera_common::serving::unknown_keys;
pub use tessera_common::serving::{
    FrontDoorConfig, ListenAddrError, ServingConfig, DEFAULT_HEADER_TIMEOUT_MS, FRONT_DOOR_KEYS,
    SERVING_KEYS, SERVING_TABLE,
};

pub use tessera_common::models::{
    valid_model_name, ModelConfig, ModelConfigError, DEFAULT_MAX_SEQUENCES, DEFAULT_QUEUE_DELAY_US,
    MODEL_KEYS,
};

/// `cluster.toml`. Its front door's keys are read into [`FrontDoorConfig`]
/// from the same file (serde's `flatten` would lose both the unknown-key
/// check and the typing of environment overrides), so unknown keys are
/// checked against both parts' lists.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default)]
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
    /// Network bandwidth between hosts assumed by the cost policy until the
    /// coordinator has measured it, GB/s (latency is always measured).
    pub inter_host_gbps: f64,
    /// Where the coordinator keeps its state (the model repository with
    /// the bytes of models clients sent, networks, deployments, the epoch):
    /// a coordinator restarted with the same folder serves everything
    /// again and adopts what its workers still run. Empty: nothing is kept.
    pub state_dir: PathBuf,
    /// Where the coordinator keeps the bytes of the models clients sent
    /// (`models/`, the most recently used few), so that a client loading
    /// one again names it by its hash and sends nothing. Empty: Tessera's
    /// cache folder (`$TESSERA_CACHE_DIR`, else `~/.cache/tessera`).
    pub cache_dir: PathBuf,
    /// The coordinator's own front door (`http_listen`, `grpc_listen`,
    /// their limits and `[serving]`: who may do what over HTTP and gRPC).
    #[serde(skip)]
    pub front_door: FrontDoorConfig,
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
            inter_host_gbps: 1.0,
            state_dir: PathBuf::new(),
            cache_dir: PathBuf::new(),
            front_door: FrontDoorConfig::default(),
            ha: HaConfig::default(),
            models: BTreeMap::new(),
        }
    }
}

/// Every environment variable that sets a key, with the key's path:
/// `TESSERA_<KEY>`, `TESSERA_SERVING_<KEY>` (`serving.key`) and
/// `TESSERA_HA_<KEY>` (`ha.key`).
fn env_keys() -> impl Iterator<Item = (String, String)> {
    let tables: [(&str, &str, &[&str]); 4] = [
        ("TESSERA_", "", &KEYS),
        ("TESSERA_", "", &FRONT_DOOR_KEYS),
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
        let cfg = Self::parts(built).map_err(|reason| {
            if reason.contains("unknown") {
                err(format!(
                    "{reason} (known keys: {}, {}; [serving]: {}; [ha]: {}; [models.NAME])",
                    KEYS.join(", "),
                    FRONT_DOOR_KEYS.join(", "),
                    SERVING_KEYS.join(", "),
                    HA_KEYS.join(", ")
                ))
            } else {
                err(reason)
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
        cfg.front_door.check().map_err(|e| err(e.to_string()))?;
        cfg.ha.check(cfg.listen).map_err(err)?;
        if cfg.ha.enabled() && cfg.state_dir.as_os_str().is_empty() {
            return Err(err(
                "[ha] needs state_dir: each coordinator keeps the model \
                 bytes clients send there (its own folder; no shared volume)"
                    .into(),
            ));
        }
        for (name, model) in &cfg.models {
            model.check(name).map_err(|e| err(e.at(name)))?;
        }
        Ok(cfg)
    }

    /// The coordinator's keys and its front door's, from one file: an
    /// unknown top-level key, a bad value or a key of a table serde
    /// refuses is the reason why not.
    fn parts(built: config::Config) -> Result<CoordinatorConfig, String> {
        let top = built
            .clone()
            .try_deserialize::<BTreeMap<String, config::Value>>();
        let top = top.map_err(|e| e.to_string())?;
        let known: [&[&str]; 3] = [&KEYS, &FRONT_DOOR_KEYS, &TABLES];
        let unknown = unknown_keys(top.keys().map(String::as_str), &known);
        if !unknown.is_empty() {
            let named: Vec<String> = unknown.iter().map(|k| format!("`{k}`")).collect();
            return Err(format!("unknown key {}", named.join(", ")));
        }
        let mut cfg: CoordinatorConfig =
            built.clone().try_deserialize().map_err(|e| e.to_string())?;
        cfg.front_door = built.try_deserialize().map_err(|e| e.to_string())?;
        Ok(cfg)
    }
}
