//! `worker.toml`: the worker's settings (see `configs/worker.toml`); the
//! command line overrides them. Unknown keys are an error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// This worker's name (its certificate is `<certs>/<name>.pem`).
    pub name: Option<String>,
    /// Device kinds, e.g. `["CPU", "GPU"]`.
    pub devices: Option<Vec<String>>,
    /// Where other workers stream tensors to this one.
    pub listen: Option<String>,
    /// The address other workers should dial, if not `listen`'s.
    pub advertise: Option<String>,
    /// The coordinator's address.
    pub coordinator: Option<String>,
    pub cluster: Option<String>,
    /// Directory made by `tessera certs init`.
    pub certs: Option<PathBuf>,
    /// Bounded mailbox of each subgraph actor.
    pub mailbox: Option<usize>,
    /// Compiled-subgraph cache directory.
    pub cache_dir: Option<PathBuf>,
    /// onnxruntime's shared library (default: `ORT_DYLIB_PATH`, then the
    /// installed Python package, then next to the executable).
    pub onnxruntime_library: Option<PathBuf>,
    /// Plugin configuration for every compile, e.g. `NUM_THREADS = "1"`;
    /// `backend = "tract" | "onnxruntime"` picks the CPU backend.
    #[serde(default)]
    pub plugin: BTreeMap<String, String>,
}

impl WorkerConfig {
    pub fn load(path: &Path) -> Result<WorkerConfig, String> {
        let origin = path.display();
        if !path.exists() {
            return Err(format!("{origin}: no such file"));
        }
        config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| format!("{origin}: {e}"))
    }
}
