//! One try of a request while it is in flight, as a pure state machine:
//! outputs, timings and failures arrive in any order from several workers
//! (each on the stream the requester opened to it) and each event says
//! whether the try is now settled (every output in, or the first failure);
//! later events change nothing. Each worker's stream ends when it has
//! nothing more for the request, and the counters are whole once every
//! one has.

use std::collections::HashMap;

use crate::tensor::Tensor;
use crate::wire::control::{Counters, NodeTime, Transfer};

/// A try in flight.
#[derive(Debug)]
pub struct TryState {
    /// Workers it runs on.
    hosts: Vec<String>,
    /// Workers whose stream for the try has ended.
    finished: Vec<String>,
    /// Graph outputs still to come.
    missing: Vec<String>,
    outputs: HashMap<String, Tensor>,
    counters: Counters,
    /// Subgraphs whose `Ran` report is awaited.
    subgraphs: usize,
    settled: bool,
}

impl TryState {
    /// A try on `hosts` waiting for `missing` from `subgraphs` subgraphs.
    pub fn new(hosts: Vec<String>, missing: Vec<String>, subgraphs: usize) -> TryState {
        TryState {
            hosts,
            finished: Vec::new(),
            missing,
            outputs: HashMap::new(),
            counters: Counters::default(),
            subgraphs,
            settled: false,
        }
    }

    /// Output `name` arrived (`transfer`: how it came): every output, once
    /// the last arrives.
    pub fn on_output(
        &mut self,
        name: String,
        tensor: Tensor,
        transfer: Transfer,
    ) -> Option<HashMap<String, Tensor>> {
        self.counters.transfers.push(transfer);
        if self.settled {
            return None;
        }
        self.missing.retain(|m| *m != name);
        self.outputs.insert(name, tensor);
        if !self.missing.is_empty() {
            return None;
        }
        self.settled = true;
        Some(std::mem::take(&mut self.outputs))
    }

    /// The try failed: the failure, unless the try was settled already.
    pub fn on_failure<F>(&mut self, failure: F) -> Option<F> {
        if self.settled {
            return None;
        }
        self.settled = true;
        self.outputs.clear();
        Some(failure)
    }

    /// A subgraph ran; whether every subgraph has now reported.
    pub fn on_ran(&mut self, subgraph: u32, micros: u64, nodes: Vec<NodeTime>) -> bool {
        self.counters.subgraphs.push((subgraph, micros));
        self.counters
            .nodes
            .extend(nodes.into_iter().map(|n| (subgraph, n)));
        self.all_reported()
    }

    /// A tensor of the try moved between workers.
    pub fn on_moved(&mut self, transfer: Transfer) {
        self.counters.transfers.push(transfer);
    }

    /// Whether every subgraph's `Ran` report is in.
    pub fn all_reported(&self) -> bool {
        self.counters.subgraphs.len() >= self.subgraphs
    }

    /// Worker `host` has nothing more for the try; whether every worker
    /// is done (the counters are then whole).
    pub fn on_host_finished(&mut self, host: &str) -> bool {
        if self.runs_on(host) && !self.finished.iter().any(|h| h == host) {
            self.finished.push(host.to_string());
        }
        self.finished.len() >= self.hosts.len()
    }

    /// Whether it runs on `worker`.
    pub fn runs_on(&self, worker: &str) -> bool {
        self.hosts.iter().any(|h| h == worker)
    }

    /// The outputs still awaited.
    pub fn missing(&self) -> &[String] {
        &self.missing
    }

    /// Its counters, subgraphs in order.
    pub fn into_counters(self) -> Counters {
        let mut counters = self.counters;
        counters.subgraphs.sort_unstable();
        counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(v: f32) -> Tensor {
        Tensor::from_values(vec![1], &[v]).unwrap()
    }

    fn transfer(name: &str) -> Transfer {
        Transfer {
            request: 1,
            tensor: name.into(),
            from: "node-b".into(),
            to: "coordinator".into(),
            bytes: 4,
            micros: 10,
        }
    }

    fn two_outputs() -> TryState {
        TryState::new(
            vec!["node-a".into(), "node-b".into()],
            vec!["y".into(), "z".into()],
            2,
        )
    }

    #[test]
    fn the_last_output_settles_the_try_with_every_output() {
        let mut t = two_outputs();
        assert!(t
            .on_output("z".into(), tensor(2.0), transfer("z"))
            .is_none());
        assert_eq!(t.missing(), ["y"]);
        let outputs = t.on_output("y".into(), tensor(1.0), transfer("y")).unwrap();
        assert_eq!(outputs.len(), 2);
        assert_eq!(outputs["y"], tensor(1.0));
        assert!(t.missing().is_empty());
    }

    #[test]
    fn after_settling_nothing_settles_it_again() {
        let mut t = two_outputs();
        t.on_output("y".into(), tensor(1.0), transfer("y"));
        t.on_output("z".into(), tensor(2.0), transfer("z")).unwrap();
        assert!(t.on_failure("late error").is_none());
        assert!(t
            .on_output("y".into(), tensor(3.0), transfer("y"))
            .is_none());
        // The late arrival is still counted as moved.
        assert_eq!(t.into_counters().transfers.len(), 3);
    }

    #[test]
    fn the_first_failure_settles_and_later_outputs_are_dropped() {
        let mut t = two_outputs();
        t.on_output("y".into(), tensor(1.0), transfer("y"));
        assert_eq!(t.on_failure("worker b was lost"), Some("worker b was lost"));
        assert_eq!(t.on_failure("second"), None);
        assert!(t
            .on_output("z".into(), tensor(2.0), transfer("z"))
            .is_none());
    }

    #[test]
    fn reports_count_until_every_subgraph_ran() {
        let mut t = two_outputs();
        assert!(!t.all_reported());
        let node = NodeTime {
            node: "conv".into(),
            micros: 5,
        };
        assert!(!t.on_ran(1, 30, vec![node]));
        assert!(t.on_ran(0, 20, vec![]));
        t.on_moved(transfer("x"));
        let counters = t.into_counters();
        assert_eq!(counters.subgraphs, vec![(0, 20), (1, 30)]);
        assert_eq!(counters.nodes.len(), 1);
        assert_eq!(counters.transfers.len(), 1);
    }

    #[test]
    fn a_try_knows_its_workers() {
        let t = two_outputs();
        assert!(t.runs_on("node-b"));
        assert!(!t.runs_on("node-c"));
    }

    #[test]
    fn the_counters_are_whole_once_every_worker_finished() {
        let mut t = two_outputs();
        assert!(!t.on_host_finished("node-b"));
        assert!(!t.on_host_finished("node-b"), "a worker counts once");
        assert!(!t.on_host_finished("node-c"), "not one of the try's");
        assert!(t.on_host_finished("node-a"));
    }
}
