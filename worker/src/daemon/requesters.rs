//! The requests requesters opened on this worker (the data channel:
//! `tessera_common::wire::data`). Each request has an owner, the identity
//! (certificate) that opened it, and the stream its replies go back on: the
//! graph outputs made here, each subgraph run's time, the transfers into
//! this worker (when counters are asked), a sampled step's tokens, a
//! failure. The stream ends once every subgraph of the request's
//! deployment here has run, or at its first failure.
//!
//! A requester's `Open` may arrive after another worker's tensors already
//! made outputs here: what the request produced meanwhile waits (a minute
//! at most) and goes out when it opens. Sequences belong to the identity
//! whose fresh step started them here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::mapref::entry::Entry as MapEntry;
use dashmap::DashMap;
use tessera_common::generation::sample;
use tessera_common::tensor::Tensor;
use tessera_common::wire::control::{ErrorKind, NodeTime, Transfer};
use tessera_common::wire::data::{DataReply, Open, Sampling};
use tessera_common::wire::generate::Steps;
use tessera_common::wire::tensor::TensorHeader;
use tessera_common::wire::{Failure, Limits, Message};
use tokio::sync::mpsc;

/// What goes back on a request's stream.
pub enum Reply {
    /// A frame: prefix and header, then the payload.
    Frame(Vec<u8>, Option<Bytes>),
    /// Nothing more: the stream ends.
    End,
}

/// Why an `Open` (or a cancel, or an end) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("request {request} belongs to another requester ({owner})")]
    RequestOwned { request: u64, owner: String },
    #[error("sequence {sequence} belongs to another requester ({owner})")]
    SequenceOwned { sequence: u64, owner: String },
}

/// What arrived for a request before its `Open`.
enum Early {
    Output(Arc<str>, Tensor, Option<Steps>),
    Ran(u32, Duration, Vec<NodeTime>, bool),
    Moved(Transfer),
    Failed(Failure),
    Unreachable(String),
}

struct Entry {
    owner: Arc<str>,
    counters: bool,
    sampling: Arc<[Sampling]>,
    tx: mpsc::UnboundedSender<Reply>,
    /// Subgraph runs still to come here.
    runs_left: u32,
}

/// Every open request of this worker.
pub struct Requests {
    worker: Arc<str>,
    limits: Limits,
    open: DashMap<u64, Entry>,
    early: DashMap<u64, (Instant, Vec<Early>)>,
    /// (deployment, sequence) → its owner.
    sequences: DashMap<(u64, u64), Arc<str>>,
}

/// How long what a request produced waits for its `Open`.
const EARLY_WAIT: Duration = Duration::from_secs(60);

impl Requests {
    pub fn new(worker: &str, limits: Limits) -> Requests {
        Requests {
            worker: worker.into(),
            limits,
            open: DashMap::new(),
            early: DashMap::new(),
            sequences: DashMap::new(),
        }
    }

    /// Opens a request for `owner`, whose deployment runs `runs` subgraphs
    /// here; returns where its replies come out. What it produced before
    /// goes out first.
    pub fn open(
        &self,
        open: &Open,
        owner: &Arc<str>,
        runs: u32,
    ) -> Result<mpsc::UnboundedReceiver<Reply>, Refusal> {
        self.claim_sequences(open, owner)?;
        let (tx, rx) = mpsc::unbounded_channel();
        match self.open.entry(open.request) {
            MapEntry::Occupied(e) => {
                return Err(Refusal::RequestOwned {
                    request: open.request,
                    owner: e.get().owner.to_string(),
                })
            }
            MapEntry::Vacant(v) => {
                v.insert(Entry {
                    owner: owner.clone(),
                    counters: open.counters,
                    sampling: open.sampling.clone().into(),
                    tx,
                    runs_left: runs.max(1),
                });
            }
        }
        if let Some((_, (_, early))) = self.early.remove(&open.request) {
            for e in early {
                self.replay(open.request, e);
            }
        }
        Ok(rx)
    }

    /// A fresh row starts its sequence for `owner` (unless another
    /// identity holds it); a later step must be its owner's.
    fn claim_sequences(&self, open: &Open, owner: &Arc<str>) -> Result<(), Refusal> {
        let Some(steps) = &open.sequence else {
            return Ok(());
        };
        for row in &steps.rows {
            let key = (open.deployment, row.id);
            let holder = self.sequences.get(&key).map(|o| o.clone());
            match holder {
                Some(o) if o != *owner => {
                    return Err(Refusal::SequenceOwned {
                        sequence: row.id,
                        owner: o.to_string(),
                    })
                }
                None if row.fresh => {
                    self.sequences.insert(key, owner.clone());
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Whether `owner` may end (or step) `sequence` of `deployment`: its
    /// owner, or a sequence nobody holds.
    pub fn may_end(&self, deployment: u64, sequence: u64, owner: &Arc<str>) -> Result<(), Refusal> {
        match self.sequences.get(&(deployment, sequence)) {
            Some(o) if *o != *owner => Err(Refusal::SequenceOwned {
                sequence,
                owner: o.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// A sequence ended: nobody holds it any more.
    pub fn ended(&self, deployment: u64, sequence: u64) {
        self.sequences.remove(&(deployment, sequence));
    }

    /// Forgets every sequence of `deployment`.
    pub fn drop_deployment(&self, deployment: u64) {
        self.sequences.retain(|(d, _), _| *d != deployment);
    }

    /// Whether `owner` may cancel `request`: its owner (or a request not
    /// open here).
    pub fn may_cancel(&self, request: u64, owner: &Arc<str>) -> Result<(), Refusal> {
        match self.open.get(&request) {
            Some(e) if e.owner != *owner => Err(Refusal::RequestOwned {
                request,
                owner: e.owner.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// Output `name` of `request` is a graph output: back to its
    /// requester (a sampled step's logits as its tokens).
    pub fn output(&self, request: u64, name: Arc<str>, tensor: Tensor, sequence: Option<&Steps>) {
        let Some(entry) = self.open.get(&request) else {
            return self.keep_early(request, Early::Output(name, tensor, sequence.cloned()));
        };
        let frame = if !entry.sampling.is_empty() && &*name == LOGITS {
            self.sampled(&entry.sampling, &tensor)
        } else {
            TensorHeader::new(0, request, &name, &tensor)
                .in_sequence(sequence.cloned())
                .encode(&self.limits)
                .map(|head| Reply::Frame(head, Some(tensor.shared_bytes())))
                .map_err(|e| e.to_string())
        };
        match frame {
            Ok(reply) => {
                let _ = entry.tx.send(reply);
            }
            Err(e) => {
                drop(entry);
                self.fail(request, ErrorKind::Worker, format!("output '{name}': {e}"));
            }
        }
    }

    /// The tokens drawn from each row's last logits.
    fn sampled(&self, sampling: &[Sampling], logits: &Tensor) -> Result<Reply, String> {
        let rows = sample::last_logits(logits, sampling.len())?;
        let tokens = rows
            .iter()
            .zip(sampling)
            .map(|(row, how)| sample::draw(row, how).ok_or("a row of logits without a number"))
            .collect::<Result<Vec<_>, _>>()?;
        self.message(&DataReply::Sampled(tokens))
    }

    fn message(&self, reply: &DataReply) -> Result<Reply, String> {
        reply
            .encode(0, &self.limits)
            .map(|head| Reply::Frame(head, None))
            .map_err(|e| e.to_string())
    }

    fn send(&self, request: u64, reply: &DataReply) {
        if let Some(entry) = self.open.get(&request) {
            if let Ok(frame) = self.message(reply) {
                let _ = entry.tx.send(frame);
            }
        }
    }

    /// A subgraph of `request` ran here (its time goes back unless it was
    /// a sequence step without counters); the stream ends after the last.
    pub fn ran(
        &self,
        request: u64,
        subgraph: u32,
        took: Duration,
        nodes: Vec<NodeTime>,
        step: bool,
    ) {
        let Some(mut entry) = self.open.get_mut(&request) else {
            return self.keep_early(request, Early::Ran(subgraph, took, nodes, step));
        };
        if entry.counters || !step {
            let nodes = if entry.counters { nodes } else { Vec::new() };
            let reply = DataReply::Ran {
                subgraph,
                micros: took.as_micros() as u64,
                nodes,
            };
            if let Ok(frame) = self.message(&reply) {
                let _ = entry.tx.send(frame);
            }
        }
        entry.runs_left = entry.runs_left.saturating_sub(1);
        if entry.runs_left == 0 {
            let _ = entry.tx.send(Reply::End);
            drop(entry);
            self.open.remove(&request);
        }
    }

    /// A tensor of `transfer.request` arrived here.
    pub fn moved(&self, transfer: Transfer) {
        let request = transfer.request;
        match self.open.get(&request) {
            Some(entry) if entry.counters => {
                drop(entry);
                self.send(request, &DataReply::Moved(transfer));
            }
            Some(_) => {}
            None => self.keep_early(request, Early::Moved(transfer)),
        }
    }

    /// `request` failed here: its requester is told, and its stream ends.
    pub fn fail(&self, request: u64, kind: ErrorKind, error: String) {
        let failure = Failure {
            request: Some(request),
            kind,
            error,
        };
        self.end_with(
            request,
            DataReply::Failed(failure.clone()),
            Early::Failed(failure),
        );
    }

    /// A tensor of `request` could not reach the worker that reads it.
    pub fn unreachable(&self, request: u64, error: String) {
        self.end_with(
            request,
            DataReply::Unreachable {
                error: error.clone(),
            },
            Early::Unreachable(error),
        );
    }

    fn end_with(&self, request: u64, reply: DataReply, early: Early) {
        match self.open.remove(&request) {
            Some((_, entry)) => {
                if let Ok(frame) = self.message(&reply) {
                    let _ = entry.tx.send(frame);
                }
                let _ = entry.tx.send(Reply::End);
            }
            None => self.keep_early(request, early),
        }
    }

    /// Forgets `request` (its requester went away, or cancelled it).
    pub fn forget(&self, request: u64) {
        if let Some((_, entry)) = self.open.remove(&request) {
            let _ = entry.tx.send(Reply::End);
        }
        self.early.remove(&request);
    }

    /// Requests open here.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Drops what waited too long for its request's `Open`.
    pub fn sweep(&self) {
        self.early
            .retain(|_, (since, _)| since.elapsed() < EARLY_WAIT);
    }

    fn keep_early(&self, request: u64, what: Early) {
        self.early
            .entry(request)
            .or_insert_with(|| (Instant::now(), Vec::new()))
            .1
            .push(what);
    }

    fn replay(&self, request: u64, what: Early) {
        match what {
            Early::Output(name, tensor, sequence) => {
                self.output(request, name, tensor, sequence.as_ref())
            }
            Early::Ran(subgraph, took, nodes, step) => {
                self.ran(request, subgraph, took, nodes, step)
            }
            Early::Moved(transfer) => self.moved(transfer),
            Early::Failed(f) => self.fail(request, f.kind, f.error),
            Early::Unreachable(e) => self.unreachable(request, e),
        }
    }

    /// This worker's name (the `to` of its transfers).
    pub fn worker(&self) -> &str {
        &self.worker
    }
}

/// The output a generative network's last stage makes, drawn from when a
/// step asks for sampling.
pub const LOGITS: &str = "logits";

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_common::wire::generate::SequenceStep;

    fn open(request: u64, sequence: Option<(u64, bool)>) -> Open {
        Open {
            deployment: 9,
            request,
            inputs: 0,
            counters: false,
            sequence: sequence.map(|(id, fresh)| {
                Steps::one(SequenceStep {
                    id,
                    step: 1,
                    fresh,
                    past: if fresh { 0 } else { 3 },
                })
            }),
            sampling: Vec::new(),
        }
    }

    fn requests() -> Requests {
        Requests::new("node-a", Limits::default())
    }

    fn frames(rx: &mut mpsc::UnboundedReceiver<Reply>) -> (usize, bool) {
        let (mut n, mut ended) = (0, false);
        while let Ok(r) = rx.try_recv() {
            match r {
                Reply::Frame(..) => n += 1,
                Reply::End => ended = true,
            }
        }
        (n, ended)
    }

    #[test]
    fn a_request_belongs_to_whoever_opened_it() {
        let r = requests();
        let (alice, mallory): (Arc<str>, Arc<str>) = ("alice".into(), "mallory".into());
        let _rx = r.open(&open(1, None), &alice, 1).unwrap();
        assert!(matches!(
            r.open(&open(1, None), &mallory, 1),
            Err(Refusal::RequestOwned { request: 1, .. })
        ));
        assert!(r.may_cancel(1, &mallory).is_err());
        assert!(r.may_cancel(1, &alice).is_ok());
    }

    #[test]
    fn a_sequence_belongs_to_whoever_started_it() {
        let r = requests();
        let (alice, mallory): (Arc<str>, Arc<str>) = ("alice".into(), "mallory".into());
        let _a = r.open(&open(1, Some((5, true))), &alice, 1).unwrap();
        // A later step of it, or an end, from another identity: refused.
        assert!(matches!(
            r.open(&open(2, Some((5, false))), &mallory, 1),
            Err(Refusal::SequenceOwned { sequence: 5, .. })
        ));
        assert!(r.may_end(9, 5, &mallory).is_err());
        assert!(r.open(&open(3, Some((5, false))), &alice, 1).is_ok());
        r.ended(9, 5);
        assert!(r.may_end(9, 5, &mallory).is_ok());
    }

    #[test]
    fn what_came_before_the_open_goes_out_when_it_opens() {
        let r = requests();
        let t = Tensor::from_values(vec![1], &[1f32]).unwrap();
        r.output(4, "y".into(), t, None);
        r.ran(4, 0, Duration::from_micros(5), Vec::new(), false);
        let mut rx = r.open(&open(4, None), &"alice".into(), 1).unwrap();
        assert_eq!(frames(&mut rx), (2, true), "the output, its run, the end");
        assert!(r.is_empty());
    }

    #[test]
    fn the_stream_ends_after_the_last_run_or_the_first_failure() {
        let r = requests();
        let mut rx = r.open(&open(6, None), &"alice".into(), 2).unwrap();
        r.ran(6, 0, Duration::ZERO, Vec::new(), false);
        assert_eq!(frames(&mut rx), (1, false));
        r.fail(6, ErrorKind::Worker, "bad".into());
        assert_eq!(frames(&mut rx), (1, true));
        // A sequence step without counters reports no run.
        let mut rx = r
            .open(&open(7, Some((8, true))), &"alice".into(), 1)
            .unwrap();
        r.ran(7, 0, Duration::ZERO, Vec::new(), true);
        assert_eq!(frames(&mut rx), (0, true));
    }
}
