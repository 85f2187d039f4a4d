//! The named models themselves: each entry's source, load request and
//! state, the repository that holds them, and the definition of a
//! `[models.NAME]` table.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tessera_common::graph::Graph;
use tessera_common::wire::control::LoadRequest;

use crate::config::ModelConfig;

/// Where a named model's ONNX bytes come from.
#[derive(Clone)]
pub enum Source {
    /// A file, read at each load (a model replaced on disk is picked up by
    /// the next load).
    File(std::path::PathBuf),
    /// Bytes a client sent.
    Bytes(Sent),
}

/// Bytes a client sent, with their sha-256 once the state store needed it
/// (computed once however often the repository is saved; shared by
/// clones).
#[derive(Clone)]
pub struct Sent {
    pub bytes: Bytes,
    sha256: Arc<std::sync::OnceLock<String>>,
    /// The bytes are not here (restored without them; `bytes` is empty):
    /// their network takes them back from the workers.
    pub lacking: bool,
}

impl Sent {
    pub fn new(bytes: Bytes) -> Sent {
        Sent {
            bytes,
            sha256: Default::default(),
            lacking: false,
        }
    }

    /// Bytes whose sha-256 is known (kept ones).
    pub fn hashed(bytes: Bytes, sha256: String) -> Sent {
        Sent {
            bytes,
            sha256: Arc::new(sha256.into()),
            lacking: false,
        }
    }

    /// Bytes with sha-256 `sha256` that are not here.
    pub fn lacking(sha256: String) -> Sent {
        Sent {
            lacking: true,
            ..Sent::hashed(Bytes::new(), sha256)
        }
    }

    /// Their sha-256, hex (blocking the first time, for large bytes).
    pub fn sha256(&self) -> String {
        self.sha256
            .get_or_init(|| crate::state::sha256_hex(&self.bytes))
            .clone()
    }
}

/// One named model.
pub struct Entry {
    pub name: String,
    pub(super) state: Mutex<EntryState>,
    /// One load or unload of this model at a time.
    pub(super) busy: tokio::sync::Mutex<()>,
}

pub(super) struct EntryState {
    pub source: Source,
    pub request: LoadRequest,
    pub wanted: bool,
    pub network: Option<u64>,
    pub loading: bool,
    /// Why the last load failed, the workers then and when.
    pub failure: Option<(String, Vec<String>, Instant)>,
    /// The model's graph (for metadata before it is loaded).
    pub graph: Option<Arc<Graph>>,
    /// Loaded without some workers its request names (absent then).
    pub degraded: bool,
}

/// The named models.
#[derive(Default)]
pub struct Repository {
    entries: dashmap::DashMap<String, Arc<Entry>>,
    /// Wakes [`keep_loaded`](super::keep_loaded): the workers changed, or a load ended.
    pub(super) changed: tokio::sync::Notify,
}

impl Repository {
    /// The repository of `[models.NAME]` tables; every one wanted.
    pub fn from_config(models: &std::collections::BTreeMap<String, ModelConfig>) -> Repository {
        let repo = Repository::default();
        for (name, model) in models {
            let (source, request) = definition(name, model);
            repo.insert(name, source, request, true);
        }
        repo
    }

    pub(super) fn insert(
        &self,
        name: &str,
        source: Source,
        request: LoadRequest,
        wanted: bool,
    ) -> Arc<Entry> {
        let entry = Arc::new(Entry {
            name: name.to_string(),
            state: Mutex::new(EntryState {
                source,
                request,
                wanted,
                network: None,
                loading: false,
                failure: None,
                graph: None,
                degraded: false,
            }),
            busy: tokio::sync::Mutex::new(()),
        });
        self.entries.insert(name.to_string(), entry.clone());
        entry
    }

    /// Something [`keep_loaded`](super::keep_loaded) decides on changed: a worker came or went,
    /// or a load ended. (A wake-up while it is not waiting is kept for its
    /// next wait.)
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    pub fn get(&self, name: &str) -> Option<Arc<Entry>> {
        self.entries.get(name).map(|e| e.clone())
    }

    /// Names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.entries.iter().map(|e| e.key().clone()).collect();
        names.sort();
        names
    }

    /// Puts a kept entry back (a restarted coordinator's).
    pub fn restore(
        &self,
        name: &str,
        source: Source,
        request: LoadRequest,
        wanted: bool,
        network: Option<u64>,
    ) {
        let entry = self.insert(name, source, request, wanted);
        entry.attach_network(network);
    }

    /// The networks named models are served by.
    pub fn networks(&self) -> Vec<u64> {
        self.entries.iter().filter_map(|e| e.network()).collect()
    }

    /// Every entry as the state store keeps it: name, source, request,
    /// wanted, network.
    pub fn records(&self) -> Vec<(String, Source, LoadRequest, bool, Option<u64>)> {
        self.entries
            .iter()
            .map(|e| {
                let s = e.lock();
                let what = (s.source.clone(), s.request.clone(), s.wanted, s.network);
                (e.name.clone(), what.0, what.1, what.2, what.3)
            })
            .collect()
    }

    /// Forgets that `network` belongs to a named model (it was unloaded by
    /// its id): the model is no longer wanted.
    pub fn network_unloaded(&self, network: u64) {
        for e in self.entries.iter() {
            let mut s = e.lock();
            if s.network == Some(network) {
                s.network = None;
                s.wanted = false;
            }
        }
    }
}

impl Entry {
    /// Its state (a panic while it was held does not lose it).
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, EntryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Network `network` serves it (a restored one), or none does.
    pub fn attach_network(&self, network: Option<u64>) {
        self.lock().network = network;
    }

    /// Network `network` serves it (a restored one).
    pub fn attach(&self, network: u64) {
        self.attach_network(Some(network));
    }

    /// The network serving it now, if loaded.
    pub fn network(&self) -> Option<u64> {
        self.lock().network
    }

    pub fn wanted(&self) -> bool {
        self.lock().wanted
    }

    /// Where its model comes from.
    pub fn source(&self) -> Source {
        self.lock().source.clone()
    }

    /// Its sent model's bytes, taken back (it lacked them).
    pub fn set_source(&self, source: Source) {
        self.lock().source = source;
    }

    /// How it is loaded now.
    pub fn request(&self) -> LoadRequest {
        self.lock().request.clone()
    }
}

/// Where a `[models.NAME]` table's model comes from and how it is placed.
pub fn definition(name: &str, model: &ModelConfig) -> (Source, LoadRequest) {
    let request = model.load_request(name, tessera_gguf::generative::is_generative(&model.path));
    (Source::File(model.path.clone()), request)
}
