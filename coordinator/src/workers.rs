//! The registered workers: what the coordinator knows of each (devices,
//! addresses, link measurements, what its heartbeats reported of its
//! deployments) and the one way it asks a worker something
//! ([`WorkerEntry::ask`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tessera_common::wire::cluster::{ToWorker, WorkerAnswer};
use tessera_common::wire::control::{
    DeviceAnswer, DeviceInfo, LinkRate, SequenceLoad, SubgraphLoad, WorkerPhase,
};
use tessera_common::wire::Limits;
use tessera_common::wire::Progress;
use tessera_net::exchange;
use tokio::sync::mpsc;

use crate::CoordinatorError;

/// A registered worker.
pub struct WorkerEntry {
    pub name: String,
    /// Where other workers stream to it.
    pub data_addr: String,
    pub devices: Vec<DeviceInfo>,
    pub connection: quinn::Connection,
    pub last_seen: Mutex<Instant>,
    /// Link bandwidth into it, GB/s, from the tensors its heartbeats say
    /// it received (moving average).
    pub(crate) bandwidth: Mutex<Option<f64>>,
    /// What its last heartbeats said of its deployments.
    pub(crate) reported: Mutex<Reported>,
    /// Subgraph runs under way, from its last heartbeat.
    pub running: std::sync::atomic::AtomicU32,
    /// Its process's resident memory, from its last heartbeat (0: unknown).
    pub rss_bytes: std::sync::atomic::AtomicU64,
    /// Its compiles and compile-cache loads since it started, as it last
    /// reported them.
    pub compiles: Mutex<tessera_common::wire::control::CompileCounts>,
    /// The coordinator's epoch when it registered: every operation sent
    /// to it carries it.
    pub epoch: u64,
    /// It said it is leaving: nothing new is planned on it.
    pub draining: std::sync::atomic::AtomicBool,
    /// Its QueryNetwork answers, by what was asked.
    pub(crate) answers: Mutex<QueryMemo>,
    /// Its connection's round trips, one per heartbeat.
    pub(crate) round_trips: Mutex<RoundTrips>,
}

/// The least of a connection's last round-trip estimates, one taken per
/// heartbeat. The planner prices a path, not a queue: on a loaded host
/// the smoothed estimate of the moment moves by milliseconds (queued
/// handshakes and heartbeats behind a compile), and a re-plan that saw
/// such a spike would move stages, shipping their weights again, for a
/// difference that was never in the link. A link that really got slower
/// shows in the window's minimum once its older samples are gone.
#[derive(Debug, Default)]
pub(crate) struct RoundTrips(std::collections::VecDeque<Duration>);

impl RoundTrips {
    /// Samples kept: about half a minute of heartbeats.
    const KEEP: usize = 32;

    pub fn sample(&mut self, rtt: Duration) {
        if self.0.len() == Self::KEEP {
            self.0.pop_front();
        }
        self.0.push_back(rtt);
    }

    /// The least sample and `now`'s estimate.
    pub fn least(&self, now: Duration) -> Duration {
        self.0.iter().copied().fold(now, Duration::min)
    }
}

/// The QueryNetwork answers a worker gave, by what was asked (the model's
/// skeleton's SHA-256 and the device kinds): its plugins answer the same
/// question the same way for as long as its process runs, and a worker
/// that registers again is a new entry with a new memo. A model loaded
/// again is planned without asking (a few hundred milliseconds for a
/// language model's thousand nodes).
#[derive(Debug, Default)]
pub(crate) struct QueryMemo(Vec<(String, Vec<DeviceAnswer>)>);

impl QueryMemo {
    /// Answers kept (the most recent).
    const KEEP: usize = 8;

    pub fn get(&self, asked: &str) -> Option<Vec<DeviceAnswer>> {
        let (_, answers) = self.0.iter().find(|(k, _)| k == asked)?;
        Some(answers.clone())
    }

    pub fn put(&mut self, asked: String, answers: Vec<DeviceAnswer>) {
        self.0.retain(|(k, _)| *k != asked);
        self.0.push((asked, answers));
        let over = self.0.len().saturating_sub(Self::KEEP);
        self.0.drain(..over);
    }
}

/// Tensors received between two heartbeats update a link's bandwidth
/// estimate when they add up to at least this much.
const MEASURED_BYTES: u64 = 256 << 10;

/// What a worker's heartbeats said of its deployments: the last one's
/// loads, and the rates between the last two.
#[derive(Debug, Clone, Default)]
pub struct Reported {
    pub subgraphs: Vec<SubgraphLoad>,
    pub sequences: Vec<SequenceLoad>,
    /// Runs per second of each (deployment, subgraph).
    rates: HashMap<(u64, u32), f64>,
    /// Compute time per second (0..1 per subgraph) of each.
    busy: HashMap<(u64, u32), f64>,
    links: Vec<LinkRate>,
    at: Option<Instant>,
}

impl Reported {
    /// Runs per second of `subgraph` of deployment `network` lately.
    pub fn rate(&self, network: u64, subgraph: u32) -> f64 {
        self.rates.get(&(network, subgraph)).copied().unwrap_or(0.0)
    }

    /// The share of the last interval `subgraph` of `network` computed.
    pub fn busy(&self, network: u64, subgraph: u32) -> f64 {
        self.busy.get(&(network, subgraph)).copied().unwrap_or(0.0)
    }
}

impl WorkerEntry {
    /// Whether it is leaving (planned around).
    pub fn draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Joining until its first heartbeat, then ready, or draining.
    pub fn phase(&self) -> WorkerPhase {
        if self.draining() {
            return WorkerPhase::Draining;
        }
        match self.reported.lock().map(|r| r.at.is_some()) {
            Ok(false) => WorkerPhase::Joining,
            _ => WorkerPhase::Ready,
        }
    }

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
        let now = self.connection.rtt();
        self.round_trips.lock().map_or(now, |r| r.least(now))
    }

    /// What its heartbeats reported.
    pub fn reported(&self) -> Reported {
        self.reported.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// A heartbeat's loads at `now`: the rates since the last one, and the
    /// link speed from what it received meanwhile.
    pub fn heard(
        &self,
        subgraphs: Vec<SubgraphLoad>,
        sequences: Vec<SequenceLoad>,
        links: Vec<LinkRate>,
        now: Instant,
    ) {
        if let Ok(mut trips) = self.round_trips.lock() {
            trips.sample(self.connection.rtt());
        }
        let Ok(mut r) = self.reported.lock() else {
            return;
        };
        if let Some(seconds) = r.at.map(|t| now.duration_since(t).as_secs_f64()) {
            if seconds > 0.0 {
                let before: HashMap<(u64, u32), &SubgraphLoad> = r
                    .subgraphs
                    .iter()
                    .map(|s| ((s.network, s.subgraph), s))
                    .collect();
                let mut rates = HashMap::new();
                let mut busy = HashMap::new();
                for s in &subgraphs {
                    if let Some(old) = before.get(&(s.network, s.subgraph)) {
                        let runs = s.runs.saturating_sub(old.runs) as f64;
                        let us = s.busy_us.saturating_sub(old.busy_us) as f64;
                        rates.insert((s.network, s.subgraph), runs / seconds);
                        busy.insert((s.network, s.subgraph), us / 1e6 / seconds);
                    }
                }
                r.rates = rates;
                r.busy = busy;
            }
            let (bytes, micros) = links.iter().fold((0, 0), |(b, m), l| {
                let old = r.links.iter().find(|o| o.peer == l.peer);
                let (ob, om) = old.map_or((0, 0), |o| (o.bytes, o.micros));
                (
                    b + l.bytes.saturating_sub(ob),
                    m + l.micros.saturating_sub(om),
                )
            });
            self.observe(bytes, micros);
        }
        r.subgraphs = subgraphs;
        r.sequences = sequences;
        r.links = links;
        r.at = Some(now);
    }

    /// The measured bandwidth to this worker, if any yet (GB/s).
    pub fn bandwidth_gbps(&self) -> Option<f64> {
        self.bandwidth.lock().ok().and_then(|b| *b)
    }

    /// Folds `bytes` received in `micros` of transfer time into the
    /// estimate.
    fn observe(&self, bytes: u64, micros: u64) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(device: &str) -> Vec<DeviceAnswer> {
        vec![DeviceAnswer {
            device: device.into(),
            supported: vec!["n0".into()],
            unsupported: Vec::new(),
            types: Vec::new(),
        }]
    }

    #[test]
    fn the_round_trip_priced_is_the_least_of_the_last_samples() {
        let ms = Duration::from_millis;
        let mut trips = RoundTrips::default();
        assert_eq!(trips.least(ms(3)), ms(3), "no samples: the estimate");
        trips.sample(ms(1));
        trips.sample(ms(40));
        assert_eq!(trips.least(ms(25)), ms(1), "a spike is not priced");
        for _ in 0..RoundTrips::KEEP {
            trips.sample(ms(9));
        }
        assert_eq!(trips.least(ms(12)), ms(9), "a slower link shows");
        assert_eq!(trips.0.len(), RoundTrips::KEEP);
    }

    #[test]
    fn answers_are_kept_by_what_was_asked_the_oldest_going_first() {
        let mut memo = QueryMemo::default();
        assert_eq!(memo.get("a|CPU"), None);
        memo.put("a|CPU".into(), answer("CPU"));
        memo.put("a|GPU".into(), answer("GPU"));
        assert_eq!(memo.get("a|CPU"), Some(answer("CPU")));
        assert_eq!(memo.get("a|GPU"), Some(answer("GPU")));
        for n in 0..QueryMemo::KEEP {
            memo.put(format!("b{n}|CPU"), answer("CPU"));
        }
        assert_eq!(memo.get("a|CPU"), None, "the oldest went first");
        assert_eq!(memo.0.len(), QueryMemo::KEEP);
        // Asked again: one entry, the newest.
        memo.put("b0|CPU".into(), answer("GPU"));
        assert_eq!(memo.get("b0|CPU"), Some(answer("GPU")));
        assert_eq!(memo.0.len(), QueryMemo::KEEP);
    }
}
