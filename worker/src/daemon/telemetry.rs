//! What this worker's subgraphs and links did, counted for the heartbeats
//! (never reported per request to the coordinator): each subgraph actor's
//! load, the tensors received from each peer, the runs under way, and the
//! subgraphs compiled or loaded from the compile cache.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use tessera_common::wire::control::{CompileCounts, LinkRate, SubgraphLoad};

/// One subgraph actor's load, as heartbeats report it.
#[derive(Debug, Default)]
pub struct SubgraphGauge {
    /// Requests it holds now.
    pub depth: AtomicU32,
    pub runs: AtomicU64,
    pub busy_us: AtomicU64,
    pub failed: AtomicU64,
}

/// Tensors received from one peer (counters).
#[derive(Debug, Default)]
struct LinkCount {
    tensors: AtomicU64,
    bytes: AtomicU64,
    micros: AtomicU64,
}

#[derive(Debug, Default)]
pub struct Telemetry {
    /// Subgraph runs under way.
    running: AtomicU32,
    /// Each subgraph actor's load: (network, subgraph) → its gauge.
    gauges: DashMap<(u64, u32), Arc<SubgraphGauge>>,
    /// Tensors received from each peer.
    received: DashMap<String, Arc<LinkCount>>,
    /// Subgraphs compiled from a model since the worker started.
    pub compiled: AtomicU64,
    /// Subgraphs loaded from the compile cache since the worker started.
    pub cache_loads: AtomicU64,
}

impl Telemetry {
    /// Compiles and compile-cache loads since the worker started.
    pub fn compile_counts(&self) -> CompileCounts {
        CompileCounts {
            compiled: self.compiled.load(Relaxed),
            cache_loads: self.cache_loads.load(Relaxed),
        }
    }

    /// The gauge of subgraph `subgraph` of `network`'s actor.
    pub fn gauge(&self, network: u64, subgraph: u32) -> Arc<SubgraphGauge> {
        self.gauges.entry((network, subgraph)).or_default().clone()
    }

    /// Every subgraph actor's load, for a heartbeat.
    pub fn subgraph_loads(&self) -> Vec<SubgraphLoad> {
        self.gauges
            .iter()
            .map(|e| SubgraphLoad {
                network: e.key().0,
                subgraph: e.key().1,
                depth: e.value().depth.load(Relaxed),
                runs: e.value().runs.load(Relaxed),
                busy_us: e.value().busy_us.load(Relaxed),
                failed: e.value().failed.load(Relaxed),
            })
            .collect()
    }

    /// Tensors received from each peer, for a heartbeat.
    pub fn link_rates(&self) -> Vec<LinkRate> {
        self.received
            .iter()
            .map(|e| LinkRate {
                peer: e.key().clone(),
                tensors: e.value().tensors.load(Relaxed),
                bytes: e.value().bytes.load(Relaxed),
                micros: e.value().micros.load(Relaxed),
            })
            .collect()
    }

    /// A tensor of `bytes` arrived from `from` in `took`.
    pub fn received(&self, from: &str, bytes: u64, took: Duration) {
        let count = self.received.entry(from.to_string()).or_default().clone();
        count.tensors.fetch_add(1, Relaxed);
        count.bytes.fetch_add(bytes, Relaxed);
        count.micros.fetch_add(took.as_micros() as u64, Relaxed);
    }

    /// Subgraphs of `network` here (each runs once per request).
    pub fn subgraphs_of(&self, network: u64) -> u32 {
        self.gauges.iter().filter(|e| e.key().0 == network).count() as u32
    }

    /// A subgraph of `network` here whose actor holds `capacity` requests
    /// or more, if any (what it is).
    pub fn full_mailbox(&self, network: u64, capacity: usize) -> Option<String> {
        self.gauges
            .iter()
            .find(|e| e.key().0 == network && e.value().depth.load(Relaxed) as usize >= capacity)
            .map(|e| format!("subgraph {} holds {capacity} requests", e.key().1))
    }

    /// A subgraph run starts (`true`) or ends.
    pub fn running(&self, starts: bool) {
        if starts {
            self.running.fetch_add(1, Relaxed);
        } else {
            self.running.fetch_sub(1, Relaxed);
        }
    }

    /// Subgraph runs under way.
    pub fn in_flight(&self) -> u32 {
        self.running.load(Relaxed)
    }

    /// Forgets `network`'s gauges.
    pub fn forget_network(&self, network: u64) {
        self.gauges.retain(|(n, _), _| *n != network);
    }
}
