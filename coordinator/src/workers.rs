//! The registered workers: what the coordinator knows of each (devices,
//! addresses, link measurements) and the one way it asks a worker
//! something ([`WorkerEntry::ask`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tessera_common::wire::cluster::{ToWorker, WorkerAnswer};
use tessera_common::wire::control::DeviceInfo;
use tessera_common::wire::Limits;
use tessera_common::wire::Progress;
use tessera_net::{exchange, Link};
use tokio::sync::mpsc;

use crate::CoordinatorError;

/// A registered worker.
pub struct WorkerEntry {
    pub name: String,
    /// Where other workers stream to it.
    pub data_addr: String,
    pub devices: Vec<DeviceInfo>,
    pub connection: quinn::Connection,
    /// Graph inputs to this worker.
    pub tensors: Link,
    pub last_seen: Mutex<Instant>,
    /// Link bandwidth to it, GB/s, measured on a probe at registration and
    /// then on every large tensor it receives (moving average).
    pub(crate) bandwidth: Mutex<Option<f64>>,
    /// Subgraph runs under way, from its last heartbeat.
    pub running: std::sync::atomic::AtomicU32,
    /// Its process's resident memory, from its last heartbeat (0: unknown).
    pub rss_bytes: std::sync::atomic::AtomicU64,
}

/// Tensors at least this large update a link's bandwidth estimate.
const MEASURED_BYTES: u64 = 256 << 10;

/// The probe sent to each worker at registration.
pub const PROBE_BYTES: usize = 4 << 20;

impl WorkerEntry {
    /// One operation on its own stream to this worker: sends `msg` (with
    /// `payload`), forwards `Progress` frames (best effort: a full channel
    /// drops a step, never the operation), returns the final answer.
    pub async fn ask(
        &self,
        limits: &Limits,
        msg: &ToWorker,
        payload: Option<&Bytes>,
        progress: Option<&mpsc::Sender<Progress>>,
    ) -> Result<WorkerAnswer, CoordinatorError> {
        let forward = |p: Progress| {
            if let Some(tx) = progress {
                let _ = tx.try_send(p);
            }
        };
        exchange::request(&self.connection, msg, payload, limits, forward)
            .await
            .map_err(|e| CoordinatorError::Worker(format!("worker {}: {e}", self.name)))
    }

    pub fn rtt(&self) -> Duration {
        self.connection.rtt()
    }

    /// The measured bandwidth to this worker, if any yet (GB/s).
    pub fn bandwidth_gbps(&self) -> Option<f64> {
        self.bandwidth.lock().ok().and_then(|b| *b)
    }

    /// Folds a received tensor of `bytes` that took `micros` into the
    /// estimate.
    pub fn observe(&self, bytes: u64, micros: u64) {
        if bytes < MEASURED_BYTES || micros == 0 {
            return;
        }
        let gbps = bytes as f64 / micros as f64 / 1e3;
        if let Ok(mut b) = self.bandwidth.lock() {
            *b = Some(match *b {
                Some(old) => 0.8 * old + 0.2 * gbps,
                None => gbps,
            });
        }
    }
}
