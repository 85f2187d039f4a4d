//! The cluster document (`GET /api/cluster`, `tessera cluster --json`):
//! coordinators, and every worker with its devices, memory (offered, used
//! by stages, used by sequences' state), load, heartbeat age and state.
//! A front door also lists the workers it saw leave as `lost`
//! ([`Roster`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use tessera_client::ClusterState;
use tessera_common::wire::control::{CoordinatorInfo, WorkerState};

/// How long a lost worker stays listed.
const LOST_SHOWN: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterDoc {
    /// The leader first, then the standbys.
    pub coordinators: Vec<CoordinatorDoc>,
    /// Loaded networks.
    pub networks: u32,
    /// Subgraph runs under way on every worker.
    pub in_flight: u32,
    pub workers: Vec<WorkerDoc>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CoordinatorDoc {
    pub addr: String,
    pub epoch: u64,
    pub leading: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerDoc {
    pub name: String,
    /// `joining` (no heartbeat yet), `ready`, `draining`, `lost` (gone
    /// from the coordinator's list: its process died or was cut off).
    pub state: &'static str,
    pub data_addr: String,
    /// Since the coordinator last heard from it, ms; for a lost worker,
    /// since the front door saw it gone.
    pub heartbeat_age_ms: u64,
    pub rtt_us: u64,
    pub bandwidth_gbps: f64,
    /// Subgraph runs under way.
    pub running: u32,
    /// Resident memory of the process, bytes (0: not reported).
    pub rss_bytes: u64,
    /// Networks with subgraphs on it.
    pub networks: Vec<u64>,
    pub compiled: u64,
    pub cache_loads: u64,
    pub devices: Vec<DeviceDoc>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceDoc {
    /// `CPU`, `GPU`, ...
    pub device: String,
    pub full_name: String,
    pub gflops: f64,
    pub bandwidth_gbps: f64,
    pub memory: MemoryDoc,
}

/// A device's memory, bytes, as the planner counts it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemoryDoc {
    /// What it offers for models (0: not reported, not limited).
    pub offered: u64,
    /// Weights and activations of the stages deployed on it.
    pub stages: u64,
    /// What those stages keep for sequences (KV caches).
    pub state: u64,
}

impl ClusterDoc {
    /// The document of `state` (no lost workers: see [`Roster`]).
    pub fn of(state: &ClusterState) -> ClusterDoc {
        ClusterDoc {
            coordinators: state.coordinators.iter().map(coordinator).collect(),
            networks: state.networks,
            in_flight: state.in_flight,
            workers: state.workers.iter().map(worker).collect(),
        }
    }
}

fn coordinator(c: &CoordinatorInfo) -> CoordinatorDoc {
    CoordinatorDoc {
        addr: c.addr.clone(),
        epoch: c.epoch,
        leading: c.leading,
    }
}

fn worker(w: &WorkerState) -> WorkerDoc {
    let of = |list: &[(String, u64)], kind: &str| {
        list.iter()
            .find(|(k, _)| k == kind)
            .map_or(0, |(_, bytes)| *bytes)
    };
    WorkerDoc {
        name: w.name.clone(),
        state: w.phase.as_str(),
        data_addr: w.data_addr.clone(),
        heartbeat_age_ms: w.silent_ms,
        rtt_us: w.rtt_us,
        bandwidth_gbps: w.bandwidth_gbps,
        running: w.running,
        rss_bytes: w.rss_bytes,
        networks: w.networks.clone(),
        compiled: w.compiles.compiled,
        cache_loads: w.compiles.cache_loads,
        devices: w
            .devices
            .iter()
            .map(|d| {
                let state = of(&w.state_in_use, &d.device);
                DeviceDoc {
                    device: d.device.clone(),
                    full_name: d.full_name.clone(),
                    gflops: d.gflops,
                    bandwidth_gbps: d.bandwidth_gbps,
                    memory: MemoryDoc {
                        offered: d.memory_bytes,
                        stages: of(&w.memory_in_use, &d.device).saturating_sub(state),
                        state,
                    },
                }
            })
            .collect(),
    }
}

/// The workers a front door has seen, to list the ones that left as lost
/// (for `LOST_SHOWN`); a worker that registers again is itself again.
#[derive(Debug, Default)]
pub struct Roster {
    /// Name → its last document and, once gone, when it was seen gone.
    seen: BTreeMap<String, (WorkerDoc, Option<Instant>)>,
}

impl Roster {
    /// `doc` with the workers that left since listed as lost, at `now`.
    pub fn update(&mut self, mut doc: ClusterDoc, now: Instant) -> ClusterDoc {
        for w in &doc.workers {
            self.seen.insert(w.name.clone(), (w.clone(), None));
        }
        for (name, (last, gone)) in self.seen.iter_mut() {
            if doc.workers.iter().any(|w| &w.name == name) {
                continue;
            }
            let since = *gone.get_or_insert(now);
            let mut lost = last.clone();
            lost.state = "lost";
            lost.running = 0;
            lost.networks.clear();
            lost.heartbeat_age_ms = now.saturating_duration_since(since).as_millis() as u64;
            for d in &mut lost.devices {
                d.memory.stages = 0;
                d.memory.state = 0;
            }
            doc.workers.push(lost);
        }
        self.seen.retain(|_, (_, gone)| {
            gone.is_none_or(|at| now.saturating_duration_since(at) < LOST_SHOWN)
        });
        doc.workers
            .retain(|w| w.state != "lost" || self.seen.contains_key(&w.name));
        doc.workers.sort_by(|a, b| a.name.cmp(&b.name));
        doc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_common::wire::control::{CompileCounts, DeviceInfo, WorkerPhase};

    fn state(names: &[&str]) -> ClusterState {
        ClusterState {
            workers: names
                .iter()
                .map(|n| WorkerState {
                    name: n.to_string(),
                    data_addr: "127.0.0.1:1".into(),
                    devices: vec![DeviceInfo {
                        device: "CPU".into(),
                        full_name: "x86".into(),
                        gflops: 50.0,
                        bandwidth_gbps: 10.0,
                        memory_bytes: 1 << 30,
                        metrics: Vec::new(),
                    }],
                    silent_ms: 100,
                    rtt_us: 50,
                    bandwidth_gbps: 0.0,
                    networks: vec![1],
                    running: 2,
                    memory_in_use: vec![("CPU".into(), 300 << 20)],
                    state_in_use: vec![("CPU".into(), 100 << 20)],
                    rss_bytes: 0,
                    compiles: CompileCounts::default(),
                    phase: WorkerPhase::Ready,
                })
                .collect(),
            networks: 1,
            in_flight: 2,
            coordinators: Vec::new(),
        }
    }

    #[test]
    fn memory_is_split_into_stages_and_state() {
        let doc = ClusterDoc::of(&state(&["node-a"]));
        let m = doc.workers[0].devices[0].memory;
        assert_eq!(
            (m.offered, m.stages, m.state),
            (1 << 30, 200 << 20, 100 << 20)
        );
        assert_eq!(doc.workers[0].state, "ready");
    }

    #[test]
    fn a_worker_that_left_is_lost_until_it_comes_back_or_five_minutes_pass() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        roster.update(ClusterDoc::of(&state(&["node-a", "node-b"])), t0);
        let doc = roster.update(
            ClusterDoc::of(&state(&["node-a"])),
            t0 + Duration::from_secs(1),
        );
        let states: Vec<(&str, &str)> = doc
            .workers
            .iter()
            .map(|w| (w.name.as_str(), w.state))
            .collect();
        assert_eq!(states, [("node-a", "ready"), ("node-b", "lost")]);
        assert_eq!(doc.workers[1].devices[0].memory.stages, 0);
        let doc = roster.update(
            ClusterDoc::of(&state(&["node-a"])),
            t0 + Duration::from_secs(3),
        );
        assert_eq!(doc.workers[1].heartbeat_age_ms, 2_000);
        let back = roster.update(
            ClusterDoc::of(&state(&["node-a", "node-b"])),
            t0 + Duration::from_secs(4),
        );
        assert!(back.workers.iter().all(|w| w.state == "ready"));
        roster.update(
            ClusterDoc::of(&state(&["node-a"])),
            t0 + Duration::from_secs(5),
        );
        let doc = roster.update(
            ClusterDoc::of(&state(&["node-a"])),
            t0 + Duration::from_secs(400),
        );
        assert_eq!(doc.workers.len(), 1);
    }
}
