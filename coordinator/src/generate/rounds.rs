//! Continuous batching: the steps of every generation on one network go
//! through one task, which runs the decode steps of all the sequences
//! waiting at that moment as one request, a row each (each stage stacks
//! the rows' kept state, padded to the longest, and keeps each row's own
//! after). A fresh step (a prompt, or a replay after a worker loss) runs
//! alone.
//!
//! At most as many requests are in flight as the deployment has stages,
//! and a batch takes at most its share of the live sequences (N / stages,
//! rounded up), so with N sequences every stage works on a batch of about
//! N / stages rows while the others work on theirs. When a batch comes back, its
//! sequences pick their next tokens and ask again; the next batch waits
//! for them (a few milliseconds at most) rather than leave with the
//! first.
//!
//! The task also ends sequences: a generation that stops while a step of
//! its sequence is in flight has its state freed once that step is back,
//! so a late step never brings it back on a stage.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_common::wire::generate::{SequenceStep, Steps};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::feed::Feed;
use crate::{requests, CoordinatorError, Shared};

/// How long a batch waits for the sequences of the last one to ask again.
const REGROUP: Duration = Duration::from_millis(5);

/// A sequence's next step.
pub struct Ask {
    pub sequence: u64,
    pub step: u32,
    pub fed: Fed,
    /// The step's deadline (`None`: the coordinator's).
    pub until: Option<Instant>,
}

/// What a step feeds.
pub enum Fed {
    /// Every token of the sequence so far (a prompt, or a replay): the
    /// stages start its state afresh.
    Fresh(Vec<u32>),
    /// The last token, the stages keeping `past` positions before it.
    Decode { token: u32, past: u32 },
}

impl Ask {
    fn fresh(&self) -> bool {
        matches!(self.fed, Fed::Fresh(_))
    }

    /// The row it is of a request.
    fn row(&self) -> SequenceStep {
        let (fresh, past) = match self.fed {
            Fed::Fresh(_) => (true, 0),
            Fed::Decode { past, .. } => (false, past),
        };
        SequenceStep {
            id: self.sequence,
            step: self.step,
            fresh,
            past,
        }
    }
}

/// An ask waiting for its batch, and where its logits go.
struct Waiting {
    ask: Ask,
    reply: oneshot::Sender<Result<Vec<f32>, CoordinatorError>>,
}

enum Msg {
    Ask(Waiting),
    /// A generation is over: free its sequence's state.
    Leave(u64),
}

/// The handle generations use; the task ends when the last one goes.
#[derive(Clone)]
pub struct Rounds {
    tx: mpsc::UnboundedSender<Msg>,
}

impl Rounds {
    /// Starts the task of `network`, which `feed` feeds and whose stages
    /// keep at most `max_rows` sequences.
    pub fn start(shared: Arc<Shared>, network: u64, feed: Arc<Feed>, max_rows: usize) -> Rounds {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Task {
            shared,
            network,
            feed,
            max_rows: max_rows.max(1),
            queue: Vec::new(),
            in_flight: JoinSet::new(),
            busy: HashSet::new(),
            live: HashSet::new(),
            ending: HashSet::new(),
            returning: 0,
            regroup_until: None,
        };
        tokio::spawn(task.run(rx));
        Rounds { tx }
    }

    /// Runs a step in the next batch that can take it.
    pub async fn step(&self, ask: Ask) -> Result<Vec<f32>, CoordinatorError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Msg::Ask(Waiting { ask, reply }))
            .map_err(|_| CoordinatorError::WorkerLost("the network was unloaded".into()))?;
        answer
            .await
            .map_err(|_| CoordinatorError::WorkerLost("the network was unloaded".into()))?
    }

    /// Frees `sequence`'s state on every stage (once no step of it is in
    /// flight).
    pub fn leave(&self, sequence: u64) -> bool {
        self.tx.send(Msg::Leave(sequence)).is_ok()
    }
}

/// A finished batch: its asks and each row's logits, or why not. The
/// task answers them itself, so it counts the answered sequences before
/// any of them can ask again.
struct Landed {
    batch: Vec<Waiting>,
    result: Result<Vec<Vec<f32>>, CoordinatorError>,
}

struct Task {
    shared: Arc<Shared>,
    network: u64,
    feed: Arc<Feed>,
    max_rows: usize,
    queue: Vec<Waiting>,
    in_flight: JoinSet<Landed>,
    /// Sequences with a step in flight.
    busy: HashSet<u64>,
    /// Sequences of generations under way.
    live: HashSet<u64>,
    /// Sequences that left while a step of theirs was in flight.
    ending: HashSet<u64>,
    /// Sequences answered whose next ask (or leave) has not come yet.
    returning: usize,
    /// Until when a batch waits for them.
    regroup_until: Option<tokio::time::Instant>,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let mut open = true;
        while open || !self.in_flight.is_empty() {
            self.launch();
            let regroup = self.regroup_until;
            tokio::select! {
                msg = rx.recv(), if open => match msg {
                    Some(Msg::Ask(waiting)) => {
                        let again = !waiting.ask.fresh();
                        self.returning = self.returning.saturating_sub(usize::from(again));
                        self.live.insert(waiting.ask.sequence);
                        self.queue.push(waiting);
                    }
                    Some(Msg::Leave(sequence)) => self.leave(sequence),
                    None => open = false,
                },
                Some(landed) = self.in_flight.join_next() => {
                    if let Ok(landed) = landed {
                        self.landed(landed);
                    }
                }
                _ = tokio::time::sleep_until(regroup.unwrap_or_else(tokio::time::Instant::now)),
                    if regroup.is_some() => {
                    self.returning = 0;
                    self.regroup_until = None;
                }
            }
        }
    }

    /// The most batches in flight: one per stage of the deployment.
    fn depth(&self) -> usize {
        let stages = self.shared.networks.get(&self.network).and_then(|loaded| {
            let deployed = loaded.replicas.iter().filter_map(|r| r.deployed());
            deployed.map(|d| d.hosts.len()).max()
        });
        stages.unwrap_or(1).max(1)
    }

    /// Sends batches while stages are free and no answered sequence is
    /// still to ask again.
    fn launch(&mut self) {
        if self.returning == 0 {
            self.regroup_until = None;
        }
        let depth = self.depth();
        while !self.queue.is_empty() && self.in_flight.len() < depth {
            let regrouping = self
                .regroup_until
                .is_some_and(|t| t > tokio::time::Instant::now());
            if regrouping {
                return;
            }
            let share = self.live.len().div_ceil(depth).clamp(1, self.max_rows);
            let batch = self.take_batch(share);
            self.busy.extend(batch.iter().map(|w| w.ask.sequence));
            let (shared, network, feed) = (self.shared.clone(), self.network, self.feed.clone());
            self.in_flight
                .spawn(async move { run_batch(&shared, network, &feed, batch).await });
        }
    }

    /// The next batch: a fresh step at the front alone, else up to `most`
    /// waiting decode steps that can join the first (any where the model
    /// pads; those of the same length where it does not).
    fn take_batch(&mut self, most: usize) -> Vec<Waiting> {
        let first_past = match self.queue[0].ask.fed {
            Fed::Decode { past, .. } if self.feed.batches() => past,
            _ => return vec![self.queue.remove(0)],
        };
        let pads = self.feed.pads();
        let mut batch = Vec::new();
        let mut rest = Vec::new();
        for waiting in self.queue.drain(..) {
            let joins = match waiting.ask.fed {
                Fed::Decode { past, .. } => pads || past == first_past,
                Fed::Fresh(_) => false,
            };
            if joins && batch.len() < most {
                batch.push(waiting);
            } else {
                rest.push(waiting);
            }
        }
        self.queue = rest;
        batch
    }

    fn landed(&mut self, Landed { batch, result }: Landed) {
        let mut answered = 0;
        for (i, waiting) in batch.into_iter().enumerate() {
            let sequence = waiting.ask.sequence;
            self.busy.remove(&sequence);
            if self.ending.remove(&sequence) {
                self.end(sequence);
            }
            let reply = match &result {
                Ok(rows) => rows
                    .get(i)
                    .cloned()
                    .ok_or_else(|| CoordinatorError::Worker("the batch lost a row".into())),
                Err(e) => Err(share(e)),
            };
            let ok = reply.is_ok();
            answered += usize::from(waiting.reply.send(reply).is_ok() && ok);
        }
        self.returning += answered;
        if answered > 0 {
            self.regroup_until = Some(tokio::time::Instant::now() + REGROUP);
        }
    }

    fn leave(&mut self, sequence: u64) {
        self.returning = self.returning.saturating_sub(1);
        self.live.remove(&sequence);
        self.queue.retain(|w| w.ask.sequence != sequence);
        if self.busy.contains(&sequence) {
            self.ending.insert(sequence);
        } else {
            self.end(sequence);
        }
    }

    fn end(&self, sequence: u64) {
        let (shared, network) = (self.shared.clone(), self.network);
        tokio::spawn(async move { requests::end_sequence(&shared, network, sequence).await });
    }
}

/// Runs `batch` as one request: each row's logits.
async fn run_batch(shared: &Arc<Shared>, network: u64, feed: &Feed, batch: Vec<Waiting>) -> Landed {
    let asks: Vec<&Ask> = batch.iter().map(|w| &w.ask).collect();
    let steps = Steps::batch(asks.iter().map(|a| a.row()).collect());
    let inputs = match &asks[0].fed {
        // A fresh step is alone (`take_batch`).
        Fed::Fresh(tokens) => feed.fresh(tokens),
        Fed::Decode { .. } => {
            let decode: Vec<(u32, u32)> = asks
                .iter()
                .filter_map(|a| match a.fed {
                    Fed::Decode { token, past } => Some((token, past)),
                    Fed::Fresh(_) => None,
                })
                .collect();
            feed.decode(&decode, steps.positions)
        }
    };
    // The batch waits as long as its most patient row; each row's own
    // deadline is its generation's to keep.
    let deadline = if asks.iter().all(|a| a.until.is_some()) {
        let now = Instant::now();
        asks.iter().filter_map(|a| a.until).max().map(|t| {
            t.saturating_duration_since(now)
                .max(Duration::from_millis(1))
        })
    } else {
        None
    };
    let result = match inputs {
        Ok(inputs) => requests::infer_step(shared, network, inputs, &steps, deadline)
            .await
            .and_then(|done| {
                feed.last_logits(&done.outputs, asks.len())
                    .map_err(|e| CoordinatorError::Worker(e.to_string()))
            }),
        Err(e) => Err(CoordinatorError::BadInput(e.to_string())),
    };
    Landed { batch, result }
}

/// The same error for each row of a failed batch.
fn share(e: &CoordinatorError) -> CoordinatorError {
    match e {
        CoordinatorError::WorkerLost(m) => CoordinatorError::WorkerLost(m.clone()),
        CoordinatorError::BadInput(m) => CoordinatorError::BadInput(m.clone()),
        CoordinatorError::UnknownNetwork(n) => CoordinatorError::UnknownNetwork(*n),
        CoordinatorError::NotReady(m) => CoordinatorError::NotReady(m.clone()),
        CoordinatorError::Deadline {
            request,
            deadline_ms,
            waiting,
        } => CoordinatorError::Deadline {
            request: *request,
            deadline_ms: *deadline_ms,
            waiting: waiting.clone(),
        },
        other => CoordinatorError::Worker(other.to_string()),
    }
}
