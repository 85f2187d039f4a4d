//! The live figures a front door shows on its page (`/api/live`): per
//! model and per second, the requests it served, their latencies, errors
//! and generated tokens, with the cluster's own figures from the workers'
//! heartbeats (every requester's requests, queue depths) sampled beside
//! them, for the last [`HISTORY_S`] seconds. A pure state machine: the
//! clock is passed in.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Seconds of history kept (5 minutes).
pub const HISTORY_S: usize = 300;
/// Latencies kept per second and model (a uniform sample beyond).
const SAMPLES_PER_SECOND: usize = 512;
/// Seconds that the current figures' percentiles cover.
const PERCENTILE_WINDOW_S: usize = 5;

/// What the heartbeats say of one model now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ClusterLoad {
    /// Requests its copies finished per second lately (every requester).
    pub requests_per_s: f64,
    /// Requests its subgraphs hold now.
    pub queued: u32,
    /// Sequences kept, and fresh ones waiting for room.
    pub sequences: u32,
    pub waiting: u32,
}

/// One second of one model.
#[derive(Debug, Clone, Default)]
struct Second {
    requests: u32,
    errors: u32,
    tokens: u32,
    latencies_ms: Vec<f32>,
    seen: u32,
    cluster: Option<ClusterLoad>,
}

impl Second {
    /// Keeps a uniform sample of the latencies (Vitter's algorithm R with
    /// a cheap deterministic index: good enough for a dashboard).
    fn latency(&mut self, ms: f32) {
        self.seen = self.seen.saturating_add(1);
        if self.latencies_ms.len() < SAMPLES_PER_SECOND {
            self.latencies_ms.push(ms);
        } else {
            let mixed = u64::from(self.seen).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
            let slot = (mixed % u64::from(self.seen)) as usize;
            if slot < SAMPLES_PER_SECOND {
                self.latencies_ms[slot] = ms;
            }
        }
    }
}

/// One model's seconds, the newest last.
#[derive(Debug, Clone, Default)]
struct Series {
    /// The second (since the start) of the newest entry.
    newest: u64,
    seconds: VecDeque<Second>,
}

impl Series {
    /// The entry of second `at`, adding empty seconds up to it.
    fn at(&mut self, at: u64) -> &mut Second {
        if self.seconds.is_empty() {
            self.newest = at;
            self.seconds.push_back(Second::default());
        }
        while self.newest < at {
            self.newest += 1;
            self.seconds.push_back(Second::default());
            if self.seconds.len() > HISTORY_S + 1 {
                self.seconds.pop_front();
            }
        }
        let back = (self.newest - at.min(self.newest)) as usize;
        let index = self.seconds.len().saturating_sub(1 + back);
        &mut self.seconds[index]
    }
}

/// Every model's figures at one front door.
#[derive(Debug, Clone)]
pub struct Live {
    start: Instant,
    models: BTreeMap<String, Series>,
}

/// One model's figures, as `/api/live` answers them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ModelLive {
    pub name: String,
    /// From the heartbeats: every requester's requests on the cluster.
    pub cluster: ClusterLoad,
    /// At this front door, over the last complete second.
    pub requests_per_s: f64,
    pub errors_per_s: f64,
    pub tokens_per_s: f64,
    /// Latency percentiles over the last 5 seconds, ms (0: none ran).
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The last 5 minutes, a point per second, oldest first.
    pub history: History,
}

/// Per-second series, oldest first, each [`HISTORY_S`] points at most.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct History {
    pub cluster_requests_per_s: Vec<f64>,
    pub queued: Vec<u32>,
    pub requests_per_s: Vec<u32>,
    pub errors_per_s: Vec<u32>,
    pub tokens_per_s: Vec<u32>,
    pub p50_ms: Vec<f64>,
    pub p99_ms: Vec<f64>,
}

impl Live {
    pub fn new(now: Instant) -> Live {
        Live {
            start: now,
            models: BTreeMap::new(),
        }
    }

    fn second(&mut self, model: &str, now: Instant) -> &mut Second {
        let at = now.saturating_duration_since(self.start).as_secs();
        self.models.entry(model.to_string()).or_default().at(at)
    }

    /// A request on `model` answered after `latency`.
    pub fn served(&mut self, model: &str, latency: Duration, now: Instant) {
        let s = self.second(model, now);
        s.requests = s.requests.saturating_add(1);
        s.latency(latency.as_secs_f32() * 1e3);
    }

    /// A request on `model` failed.
    pub fn failed(&mut self, model: &str, now: Instant) {
        let s = self.second(model, now);
        s.errors = s.errors.saturating_add(1);
    }

    /// `n` tokens generated on `model`.
    pub fn generated(&mut self, model: &str, n: usize, now: Instant) {
        let s = self.second(model, now);
        s.tokens = s.tokens.saturating_add(n as u32);
    }

    /// What the heartbeats said of `model` at `now`.
    pub fn sampled(&mut self, model: &str, load: ClusterLoad, now: Instant) {
        self.second(model, now).cluster = Some(load);
    }

    /// Forgets models not in `keep` (unloaded).
    pub fn retain(&mut self, keep: &[String]) {
        self.models.retain(|name, _| keep.contains(name));
    }

    /// Every model's figures at `now`.
    pub fn snapshot(&mut self, now: Instant) -> Vec<ModelLive> {
        let names: Vec<String> = self.models.keys().cloned().collect();
        names
            .into_iter()
            .map(|name| {
                // Seconds up to now exist (empty where nothing happened).
                self.second(&name, now);
                let series = &self.models[&name];
                model_live(name, series)
            })
            .collect()
    }
}

/// One model's figures from its seconds (the newest one still filling).
fn model_live(name: String, series: &Series) -> ModelLive {
    let seconds: Vec<&Second> = series.seconds.iter().collect();
    // Every second but the one still filling.
    let done = &seconds[..seconds.len().saturating_sub(1)];
    let done = &done[done.len().saturating_sub(HISTORY_S)..];
    let last = done.last().copied().cloned().unwrap_or_default();
    let recent: Vec<f32> = done
        .iter()
        .rev()
        .take(PERCENTILE_WINDOW_S)
        .flat_map(|s| s.latencies_ms.iter().copied())
        .collect();
    let mut history = History::default();
    let mut cluster = ClusterLoad::default();
    for s in seconds.iter().skip(seconds.len().saturating_sub(HISTORY_S)) {
        if let Some(c) = s.cluster {
            cluster = c;
        }
    }
    for s in done {
        let c = s.cluster.unwrap_or_default();
        history
            .cluster_requests_per_s
            .push(round2(c.requests_per_s));
        history.queued.push(c.queued);
        history.requests_per_s.push(s.requests);
        history.errors_per_s.push(s.errors);
        history.tokens_per_s.push(s.tokens);
        history
            .p50_ms
            .push(round2(percentile(&s.latencies_ms, 0.50)));
        history
            .p99_ms
            .push(round2(percentile(&s.latencies_ms, 0.99)));
    }
    ModelLive {
        name,
        cluster,
        requests_per_s: last.requests as f64,
        errors_per_s: last.errors as f64,
        tokens_per_s: last.tokens as f64,
        p50_ms: round2(percentile(&recent, 0.50)),
        p99_ms: round2(percentile(&recent, 0.99)),
        history,
    }
}

/// The `q` quantile of `values` (nearest rank; 0 for none).
fn percentile(values: &[f32], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f32::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] as f64
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn a_second_counts_once_it_is_complete() {
        let t0 = Instant::now();
        let mut live = Live::new(t0);
        for i in 0..10 {
            live.served("rec", ms(10 + i), t0 + ms(100 * i));
        }
        live.failed("rec", t0 + ms(500));
        // The first second is still filling: nothing counted yet.
        let now = live.snapshot(t0 + ms(900));
        assert_eq!(now[0].requests_per_s, 0.0);
        assert!(now[0].history.requests_per_s.is_empty());
        let later = live.snapshot(t0 + ms(1_200));
        assert_eq!(later[0].requests_per_s, 10.0);
        assert_eq!(later[0].errors_per_s, 1.0);
        assert_eq!(later[0].history.requests_per_s, vec![10]);
        assert_eq!(later[0].p50_ms, 14.0);
        assert_eq!(later[0].p99_ms, 19.0);
    }

    #[test]
    fn quiet_seconds_are_zeros_and_history_keeps_five_minutes() {
        let t0 = Instant::now();
        let mut live = Live::new(t0);
        live.served("m", ms(5), t0);
        let s = live.snapshot(t0 + Duration::from_secs(4));
        assert_eq!(s[0].history.requests_per_s, vec![1, 0, 0, 0]);
        assert_eq!(s[0].requests_per_s, 0.0);
        // Percentiles cover the last 5 complete seconds.
        assert_eq!(s[0].p50_ms, 5.0);
        let s = live.snapshot(t0 + Duration::from_secs(1_000));
        assert_eq!(s[0].history.requests_per_s.len(), HISTORY_S);
        assert!(s[0].history.requests_per_s.iter().all(|&r| r == 0));
        assert_eq!(s[0].p50_ms, 0.0);
    }

    #[test]
    fn tokens_and_the_clusters_figures_are_kept_per_second() {
        let t0 = Instant::now();
        let mut live = Live::new(t0);
        live.generated("llm", 7, t0 + ms(100));
        live.generated("llm", 5, t0 + ms(900));
        let load = ClusterLoad {
            requests_per_s: 12.5,
            queued: 3,
            sequences: 2,
            waiting: 1,
        };
        live.sampled("llm", load, t0 + ms(950));
        let s = live.snapshot(t0 + ms(1_100));
        assert_eq!(s[0].tokens_per_s, 12.0);
        assert_eq!(s[0].cluster, load);
        assert_eq!(s[0].history.cluster_requests_per_s, vec![12.5]);
        assert_eq!(s[0].history.queued, vec![3]);
        live.retain(&[]);
        assert!(live.snapshot(t0 + ms(1_200)).is_empty());
    }

    #[test]
    fn a_busy_second_keeps_a_bounded_sample() {
        let t0 = Instant::now();
        let mut live = Live::new(t0);
        for i in 0..5_000u64 {
            live.served("m", ms(i % 100), t0 + Duration::from_micros(i * 100));
        }
        let s = live.snapshot(t0 + ms(1_500));
        assert_eq!(s[0].requests_per_s, 5_000.0);
        assert!(s[0].p50_ms > 20.0 && s[0].p50_ms < 80.0, "{}", s[0].p50_ms);
        assert_eq!(
            live.models["m"].seconds[0].latencies_ms.len(),
            SAMPLES_PER_SECOND
        );
    }
}
