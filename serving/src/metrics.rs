//! A front door's Prometheus metrics, served in the Prometheus text format
//! at its `/metrics` (with the coordinator's cluster metrics where the
//! front door runs in the coordinator). Each front door has its own
//! recorder (no process-wide registry), so several in one process (tests,
//! embedded clusters) keep their figures apart.
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `tessera_requests_total` | model | requests run (HTTP and gRPC) |
//! | `tessera_request_failures_total` | model, reason | failed requests |
//! | `tessera_requests_in_flight` | model | requests under way |
//! | `tessera_request_duration_seconds` | model | end to end, at the front door |
//! | `tessera_queue_duration_seconds` | model | time neither computing nor on the wire |
//! | `tessera_compute_duration_seconds` | model, subgraph | one subgraph's run |
//! | `tessera_transfer_duration_seconds` | from, to | one tensor over one link |
//! | `tessera_transfer_bytes_total` | from, to | bytes moved per link |
//! | `tessera_unauthorized_total` | | calls refused for a missing or unknown token |

use std::time::Duration;

use metrics::{counter, gauge, histogram, with_local_recorder};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use tessera_common::wire::control::Counters;

/// Histogram buckets, seconds: 100 µs to ~26 s, doubling.
fn buckets() -> Vec<f64> {
    (0..19).map(|i| 1e-4 * f64::powi(2.0, i)).collect()
}

pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let builder = PrometheusBuilder::new();
        let builder = match builder.set_buckets(&buckets()) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("histogram buckets: {e}; latencies are summaries");
                PrometheusBuilder::new()
            }
        };
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let metrics = Metrics { recorder, handle };
        metrics.describe();
        metrics
    }

    fn record(&self, f: impl FnOnce()) {
        with_local_recorder(&self.recorder, f)
    }

    fn describe(&self) {
        use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
        self.record(|| {
            describe_counter!(
                "tessera_requests_total",
                "Requests run, by model (SDK and HTTP)."
            );
            describe_counter!(
                "tessera_request_failures_total",
                "Failed requests, by model and reason."
            );
            describe_gauge!(
                "tessera_requests_in_flight",
                "Requests under way, by model."
            );
            describe_histogram!(
                "tessera_request_duration_seconds",
                Unit::Seconds,
                "End-to-end request latency at the front door."
            );
            describe_histogram!(
                "tessera_queue_duration_seconds",
                Unit::Seconds,
                "Time a request spent neither computing nor on the wire (mailboxes, queues)."
            );
            describe_histogram!(
                "tessera_compute_duration_seconds",
                Unit::Seconds,
                "Compute time of one subgraph run."
            );
            describe_histogram!(
                "tessera_transfer_duration_seconds",
                Unit::Seconds,
                "Time one tensor took over one link."
            );
            describe_counter!("tessera_transfer_bytes_total", "Bytes moved per link.");
            describe_counter!(
                "tessera_unauthorized_total",
                "HTTP and gRPC requests refused for a missing or unknown bearer token."
            );
        });
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// A request on `model` starts; the guard counts it in flight until
    /// dropped.
    pub fn started(&self, model: &str) -> InFlight<'_> {
        self.record(|| {
            counter!("tessera_requests_total", "model" => model.to_string()).increment(1);
            gauge!("tessera_requests_in_flight", "model" => model.to_string()).increment(1.0);
        });
        InFlight {
            metrics: self,
            model: model.to_string(),
        }
    }

    /// A request on `model` finished in `elapsed` with these counters.
    pub fn succeeded(&self, model: &str, elapsed: Duration, counters: &Counters) {
        let mut busy = 0u64;
        self.record(|| {
            for &(subgraph, micros) in &counters.subgraphs {
                busy += micros;
                histogram!("tessera_compute_duration_seconds",
                    "model" => model.to_string(), "subgraph" => subgraph.to_string())
                .record(micros as f64 * 1e-6);
            }
            for t in &counters.transfers {
                busy += t.micros;
                histogram!("tessera_transfer_duration_seconds",
                    "from" => t.from.clone(), "to" => t.to.clone())
                .record(t.micros as f64 * 1e-6);
                counter!("tessera_transfer_bytes_total",
                    "from" => t.from.clone(), "to" => t.to.clone())
                .increment(t.bytes);
            }
            let total = elapsed.as_secs_f64();
            histogram!("tessera_request_duration_seconds", "model" => model.to_string())
                .record(total);
            histogram!("tessera_queue_duration_seconds", "model" => model.to_string())
                .record((total - busy as f64 * 1e-6).max(0.0));
        });
    }

    pub fn failed(&self, model: &str, reason: &str) {
        self.record(|| {
            counter!("tessera_request_failures_total",
                "model" => model.to_string(), "reason" => reason.to_string())
            .increment(1);
        });
    }

    /// A request without a token the server accepts.
    pub fn unauthorized(&self) {
        self.record(|| counter!("tessera_unauthorized_total").increment(1));
    }
}

/// A request counted in flight until dropped.
pub struct InFlight<'a> {
    metrics: &'a Metrics,
    model: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let model = std::mem::take(&mut self.model);
        self.metrics.record(|| {
            gauge!("tessera_requests_in_flight", "model" => model).decrement(1.0);
        });
    }
}
