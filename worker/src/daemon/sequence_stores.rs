//! Each stateful network's kept sequence state on this worker: one
//! [`SequenceStore`] per network, shared by its subgraph actors here.

use std::sync::{Arc, Mutex};

use dashmap::DashMap;
use tessera_common::wire::control::SequenceLoad;

use super::sequences::SequenceStore;

#[derive(Default)]
pub struct SequenceStores(DashMap<u64, Arc<Mutex<SequenceStore>>>);

impl SequenceStores {
    /// The store of `network` (made on first use, keeping at most
    /// `max_sequences`).
    pub fn store(&self, network: u64, max_sequences: u32) -> Arc<Mutex<SequenceStore>> {
        self.0
            .entry(network)
            .or_insert_with(|| Arc::new(Mutex::new(SequenceStore::new(max_sequences))))
            .clone()
    }

    /// Every stateful network's sequences, for a heartbeat.
    pub fn loads(&self) -> Vec<SequenceLoad> {
        self.0
            .iter()
            .map(|e| {
                let store = e.value().lock().unwrap_or_else(|p| p.into_inner());
                SequenceLoad {
                    network: *e.key(),
                    kept: store.len() as u32,
                    waiting: store.waiting() as u32,
                }
            })
            .collect()
    }

    /// Frees `sequence`'s state of `network`; whether it held any.
    pub fn end(&self, network: u64, sequence: u64) -> bool {
        self.0.get(&network).is_some_and(|store| {
            let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
            store.end(sequence)
        })
    }

    pub fn remove(&self, network: u64) {
        self.0.remove(&network);
    }
}
