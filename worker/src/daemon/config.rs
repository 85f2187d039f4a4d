//! `worker.toml`: the worker's settings (see `configs/worker.toml`); the
//! command line overrides them. Unknown keys are an error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tessera_common::serving::{unknown_keys, FrontDoorConfig, FRONT_DOOR_KEYS, SERVING_TABLE};

/// The worker's own keys in `worker.toml` (beside its front door's,
/// [`FRONT_DOOR_KEYS`] and `[serving]`).
pub const WORKER_KEYS: [&str; 18] = [
    "name",
    "devices",
    "listen",
    "advertise",
    "coordinator",
    "cluster",
    "certs",
    "mailbox",
    "cache_dir",
    "cache_limit",
    "models_dirs",
    "adopt_grace_s",
    "drain_timeout_s",
    "memory_limit",
    "memory_reserve",
    "onnxruntime_library",
    "plugin",
    // `[serving]` is the front door's table.
    SERVING_TABLE,
];

/// `worker.toml`. Its front door's keys are read into [`FrontDoorConfig`]
/// from the same file, so unknown keys are checked against both parts'
/// lists.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct WorkerConfig {
    /// This worker's name (its certificate is `<certs>/<name>.pem`).
    pub name: Option<String>,
    /// Device kinds, e.g. `["CPU", "GPU"]`.
    pub devices: Option<Vec<String>>,
    /// Where other workers stream tensors to this one.
    pub listen: Option<String>,
    /// The address other workers should dial, if not `listen`'s.
    pub advertise: Option<String>,
    /// The coordinator's address; with HA, every coordinator's, comma-separated.
    pub coordinator: Option<String>,
    pub cluster: Option<String>,
    /// Directory made by `tessera certs init`.
    pub certs: Option<PathBuf>,
    /// Bounded mailbox of each subgraph actor.
    pub mailbox: Option<usize>,
    /// Where compiled subgraphs and received weights are kept.
    pub cache_dir: Option<PathBuf>,
    /// The most each of the two caches keeps (`"16GiB"`).
    pub cache_limit: Option<String>,
    /// Directories this worker may read models from, to take their
    /// weights from its own disk instead of receiving them.
    pub models_dirs: Option<Vec<PathBuf>>,
    /// Seconds what is deployed here keeps serving after the coordinator
    /// is lost, waiting for one to adopt it (default 300).
    pub adopt_grace_s: Option<f64>,
    /// Stopped with deployments here, the longest it keeps serving while
    /// the coordinator moves them (default 20; 0: stop at once).
    pub drain_timeout_s: Option<f64>,
    /// The most memory each device may use for models: one size for every
    /// device (`"2GiB"`) or sizes by kind (`"CPU=2GiB,GPU=8GiB"`); without
    /// it a device offers what it has available.
    pub memory_limit: Option<String>,
    /// Memory kept back from the CPU's for the worker process itself
    /// (`"384MiB"`).
    pub memory_reserve: Option<String>,
    /// onnxruntime's shared library (default: `ORT_DYLIB_PATH`, then the
    /// installed Python package, then next to the executable).
    pub onnxruntime_library: Option<PathBuf>,
    /// Plugin configuration for every compile, e.g. `NUM_THREADS = "1"`;
    /// `backend = "tract" | "onnxruntime"` picks the CPU backend.
    #[serde(default)]
    pub plugin: BTreeMap<String, String>,
    /// This worker's front door (`http_listen`, `grpc_listen`, their
    /// limits and `[serving]`, as the coordinator's); off by default.
    #[serde(skip)]
    pub front_door: FrontDoorConfig,
}

/// Why `worker.toml` cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum WorkerConfigError {
    #[error("{0}: no such file")]
    NoFile(PathBuf),
    /// Not TOML, or a value of the wrong type.
    #[error("{path}: {source}")]
    Invalid {
        path: PathBuf,
        source: config::ConfigError,
    },
    #[error("{path}: unknown key {} (known keys: {}, {})", .keys.join(", "), WORKER_KEYS.join(", "), FRONT_DOOR_KEYS.join(", "))]
    UnknownKeys { path: PathBuf, keys: Vec<String> },
    #[error("{path}: {source}")]
    FrontDoor {
        path: PathBuf,
        source: tessera_common::serving::FrontDoorConfigError,
    },
}

impl WorkerConfig {
    pub fn load(path: &Path) -> Result<WorkerConfig, WorkerConfigError> {
        if !path.exists() {
            return Err(WorkerConfigError::NoFile(path.to_path_buf()));
        }
        let invalid = |source| WorkerConfigError::Invalid {
            path: path.to_path_buf(),
            source,
        };
        let built = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .build()
            .map_err(invalid)?;
        let top: BTreeMap<String, config::Value> =
            built.clone().try_deserialize().map_err(invalid)?;
        let keys = unknown_keys(
            top.keys().map(String::as_str),
            &[&WORKER_KEYS, &FRONT_DOOR_KEYS],
        );
        if !keys.is_empty() {
            let path = path.to_path_buf();
            return Err(WorkerConfigError::UnknownKeys { path, keys });
        }
        let mut cfg: WorkerConfig = built.clone().try_deserialize().map_err(invalid)?;
        cfg.front_door = built.try_deserialize().map_err(invalid)?;
        cfg.front_door
            .check()
            .map_err(|source| WorkerConfigError::FrontDoor {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(cfg)
    }
}

/// Why a memory limit does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryLimitError {
    #[error("memory limit: {0}")]
    Size(#[from] tessera_common::memory::SizeError),
    #[error("memory limit: '{0}' is neither SIZE nor KIND=SIZE (e.g. CPU=2GiB,GPU=8GiB)")]
    NotSizeOrKind(String),
    #[error("memory limit: '{0}' names no device kind")]
    NoKind(String),
    #[error("memory reserve: {reserve} bytes leave nothing of the CPU's limit of {limit} bytes")]
    ReserveTooBig { reserve: u64, limit: u64 },
}

/// Memory limits of a worker's devices: one size for every device
/// (`2GiB`), or sizes by device kind (`CPU=2GiB,GPU=8GiB`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryLimits {
    all: Option<u64>,
    by_kind: BTreeMap<String, u64>,
    /// Kept back from the CPU's memory for the worker process itself.
    cpu_reserve: u64,
}

impl MemoryLimits {
    /// The limit of a device of `kind`, if any.
    pub fn of(&self, kind: &str) -> Option<u64> {
        self.by_kind.get(kind).copied().or(self.all)
    }

    /// The same limits with `reserve` bytes kept back from the CPU's
    /// memory (its limit, or what the machine has available) for the
    /// worker process itself: its runtime, allocator and buffers. In a
    /// container the limit is the container's, so the planner never places
    /// more than the container may use.
    pub fn reserving(mut self, reserve: u64) -> Result<Self, MemoryLimitError> {
        if let Some(limit) = self.of("CPU") {
            if reserve >= limit {
                return Err(MemoryLimitError::ReserveTooBig { reserve, limit });
            }
        }
        self.cpu_reserve = reserve;
        Ok(self)
    }

    /// What a device of `kind` offers for models: its limit, else what it
    /// `reported`, less the reserve for a CPU; `None` when neither is known.
    pub fn offered(&self, kind: &str, reported: Option<u64>) -> Option<u64> {
        let memory = self.of(kind).or(reported)?;
        Some(match kind {
            "CPU" => memory.saturating_sub(self.cpu_reserve),
            _ => memory,
        })
    }
}

impl std::str::FromStr for MemoryLimits {
    type Err = MemoryLimitError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        use tessera_common::memory::parse_limit;
        let mut limits = MemoryLimits::default();
        if !text.contains('=') {
            limits.all = Some(parse_limit(text)?);
            return Ok(limits);
        }
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (kind, size) = entry
                .split_once('=')
                .ok_or_else(|| MemoryLimitError::NotSizeOrKind(entry.to_string()))?;
            let kind = kind.trim().to_ascii_uppercase();
            if kind.is_empty() {
                return Err(MemoryLimitError::NoKind(entry.to_string()));
            }
            limits.by_kind.insert(kind, parse_limit(size)?);
        }
        Ok(limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limits_parse_for_all_devices_or_by_kind() {
        let all: MemoryLimits = "64MiB".parse().unwrap();
        assert_eq!(
            (all.of("CPU"), all.of("GPU")),
            (Some(64 << 20), Some(64 << 20))
        );
        let by: MemoryLimits = "CPU=2GiB, gpu=8GiB".parse().unwrap();
        assert_eq!((by.of("CPU"), by.of("GPU")), (Some(2 << 30), Some(8 << 30)));
        assert_eq!(by.of("NPU"), None);
        for bad in ["0", "lots", "CPU=0", "=2GiB", "CPU=2GiB,GPU"] {
            let e = bad.parse::<MemoryLimits>().unwrap_err();
            assert!(e.to_string().starts_with("memory limit"), "{bad}: {e}");
        }
        let reserved = "CPU=2GiB"
            .parse::<MemoryLimits>()
            .unwrap()
            .reserving(512 << 20)
            .unwrap();
        assert_eq!(reserved.offered("CPU", Some(1 << 40)), Some(1536 << 20));
        assert_eq!(reserved.offered("GPU", Some(8 << 30)), Some(8 << 30));
        assert_eq!(reserved.offered("GPU", None), None);
        let unlimited = MemoryLimits::default().reserving(1 << 30).unwrap();
        assert_eq!(unlimited.offered("CPU", Some(5 << 30)), Some(4 << 30));
        assert_eq!(
            all.reserving(64 << 20),
            Err(MemoryLimitError::ReserveTooBig {
                reserve: 64 << 20,
                limit: 64 << 20
            })
        );
        assert_eq!(
            "=2GiB".parse::<MemoryLimits>(),
            Err(MemoryLimitError::NoKind("=2GiB".into()))
        );
        assert_eq!(
            "CPU=2GiB,GPU".parse::<MemoryLimits>(),
            Err(MemoryLimitError::NotSizeOrKind("GPU".into()))
        );
    }
}
