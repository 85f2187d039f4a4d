//! The model repository: networks known by a name. Named models come from
//! `[models.NAME]` tables of the configuration (loaded at start) or are
//! loaded by name through the SDK, the CLI (`tessera load NAME MODEL`) or
//! the KServe repository extension (`POST /v2/repository/models/NAME/load`).
//!
//! A named model the coordinator should serve is *wanted*: [`keep_loaded`]
//! loads every wanted model that has no network as soon as the workers its
//! devices and pins name are registered, and tries again when the set of
//! workers changes (or after [`RETRY_AFTER`]) when a load fails. Workers
//! it names that are still absent `worker_timeout_ms` after the
//! coordinator started are left out (as a re-plan after a loss leaves them
//! out); once they register, the model is planned again with them. A worker loss is healed by
//! [`crate::heal`] (the network outlives its deployments), so a request by
//! name is always served by the network's current deployment, and a
//! restarted coordinator loads its configured models again by itself.
//! Models loaded from bytes (SDK, CLI) live in the coordinator's memory.
//!
//! By job: `registry` (the entries and the repository holding them),
//! `status` (each model's status, the network serving it, its graph),
//! `files` (reading a model's files: ONNX, GGUF or a model folder, a
//! tokenizer), `load` (loading and unloading by name), `keep` (keeping the
//! wanted models loaded).

use std::time::Duration;

mod files;
mod keep;
mod load;
mod registry;
mod status;

pub(crate) use files::read;
pub use keep::keep_loaded;
pub use load::{load, progress_log, unload};
pub use registry::{definition, Entry, Repository, Sent, Source};
pub use status::{graph, serving, status, statuses};

/// A failed load is tried again after this long even if the workers did
/// not change.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);
