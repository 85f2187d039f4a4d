//! The cluster's Prometheus metrics as the coordinator sees them: its
//! workers, re-plans, and what the workers' heartbeats report of every
//! subgraph (no request passes through the coordinator: the request
//! metrics are each front door's). Rendered in the Prometheus text format,
//! with the coordinator's front door's own, at its `/metrics`. Each
//! coordinator has its own recorder (no process-wide registry), so several
//! coordinators in one process (tests, embedded clusters) keep their
//! figures apart.
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `tessera_mailbox_depth` | model, worker, subgraph | requests a subgraph actor holds |
//! | `tessera_subgraph_runs_total` | model, worker, subgraph | runs of a subgraph |
//! | `tessera_subgraph_busy_microseconds_total` | model, worker, subgraph | its compute time, µs |
//! | `tessera_subgraph_failures_total` | model, worker, subgraph | runs that failed |
//! | `tessera_worker_up` | worker | 1 while registered, 0 once lost |
//! | `tessera_replans_total` | model | re-plans after a worker loss |

use std::collections::{HashMap, HashSet};

use metrics::{counter, gauge, with_local_recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tessera_common::wire::control::SubgraphLoad;

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Mailbox gauges each worker reported last: (model, subgraph).
    mailboxes: std::sync::Mutex<HashMap<String, HashSet<(String, u32)>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let metrics = Metrics {
            recorder,
            handle,
            mailboxes: Default::default(),
        };
        metrics.describe();
        metrics
    }

    fn record(&self, f: impl FnOnce()) {
        with_local_recorder(&self.recorder, f)
    }

    fn describe(&self) {
        use metrics::{describe_counter, describe_gauge};
        self.record(|| {
            describe_gauge!(
                "tessera_mailbox_depth",
                "Requests a subgraph actor holds (waiting for inputs, ready, computing)."
            );
            describe_gauge!(
                "tessera_worker_up",
                "1 while a worker is registered, 0 once lost."
            );
            describe_counter!("tessera_replans_total", "Re-plans after a worker loss.");
            describe_counter!(
                "tessera_subgraph_runs_total",
                "Runs of a subgraph, as its worker's heartbeats report them."
            );
            describe_counter!(
                "tessera_subgraph_busy_microseconds_total",
                "Compute time of a subgraph, µs, as its worker's heartbeats report it."
            );
            describe_counter!(
                "tessera_subgraph_failures_total",
                "Failed runs of a subgraph, as its worker's heartbeats report them."
            );
        });
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    pub fn worker_up(&self, worker: &str, up: bool) {
        self.record(|| {
            gauge!("tessera_worker_up", "worker" => worker.to_string()).set(if up {
                1.0
            } else {
                0.0
            });
        });
        if !up {
            self.subgraph_loads(worker, Vec::new());
        }
    }

    pub fn replanned(&self, model: &str) {
        self.record(|| {
            counter!("tessera_replans_total", "model" => model.to_string()).increment(1);
        });
    }

    /// A worker's heartbeat: the load of each of its subgraph actors, by
    /// model. Depths it no longer reports drop to 0.
    pub fn subgraph_loads(&self, worker: &str, loads: Vec<(String, SubgraphLoad)>) {
        let now: HashSet<(String, u32)> =
            loads.iter().map(|(m, l)| (m.clone(), l.subgraph)).collect();
        let before = match self.mailboxes.lock() {
            Ok(mut seen) => seen
                .insert(worker.to_string(), now.clone())
                .unwrap_or_default(),
            Err(_) => HashSet::new(),
        };
        self.record(|| {
            let labels = |model: &str, subgraph: u32| {
                [
                    ("model", model.to_string()),
                    ("worker", worker.to_string()),
                    ("subgraph", subgraph.to_string()),
                ]
            };
            for (model, subgraph) in before.difference(&now) {
                gauge!("tessera_mailbox_depth", &labels(model, *subgraph)).set(0.0);
            }
            for (model, l) in &loads {
                let at = labels(model, l.subgraph);
                gauge!("tessera_mailbox_depth", &at).set(f64::from(l.depth));
                counter!("tessera_subgraph_runs_total", &at).absolute(l.runs);
                counter!("tessera_subgraph_busy_microseconds_total", &at).absolute(l.busy_us);
                counter!("tessera_subgraph_failures_total", &at).absolute(l.failed);
            }
        });
    }
}
