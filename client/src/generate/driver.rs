//! One task per copy of a generative network, at the requester: it runs
//! the steps of the copy's sequences as the [`Batcher`] hands them out (a
//! fresh step alone, decode steps of several sequences as one request, a
//! row each) and answers each row with the token its copy's last stage
//! drew. A sequence stays on its copy (its state is there); when it ends,
//! its state is freed on every worker of the copy, once no step of it is
//! in flight.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_common::generation::batcher::{Ask, Batcher};
use tessera_common::generation::feed::Feed;
use tessera_common::wire::control::ErrorKind;
use tessera_common::wire::data::{DataReply, DataRequest, SampledToken, Sampling};
use tessera_common::wire::generate::{SequenceStep, Steps};
use tessera_net::exchange;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use crate::{infer, ClientError, Network, Operation};

/// What a step feeds.
pub enum Fed {
    /// Every token of the sequence so far (a prompt, or a replay): the
    /// stages start its state afresh.
    Fresh(Vec<u32>),
    /// The last token, the stages keeping `past` positions before it.
    Decode { token: u32, past: u32 },
}

/// A sequence's next step.
pub struct Step {
    pub sequence: u64,
    /// Its number (one more each step, a replay included).
    pub number: u32,
    pub fed: Fed,
    pub sampling: Sampling,
    pub until: Instant,
}

enum Msg {
    Step(Step, oneshot::Sender<Result<SampledToken, ClientError>>),
    Leave(u64),
}

/// The handle of one copy's task; the task ends when the last handle goes.
#[derive(Clone)]
pub struct Copy {
    tx: mpsc::UnboundedSender<Msg>,
}

impl Copy {
    /// Starts the task of copy `copy` of `network` (`stages` stages, each
    /// keeping at most `max_rows` sequences).
    pub fn start(
        network: Network,
        copy: u32,
        feed: Arc<Feed>,
        stages: usize,
        max_rows: usize,
    ) -> Copy {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = Task {
            batcher: Batcher::new(stages, max_rows, feed.pads(), feed.batches()),
            network,
            copy,
            feed,
            waiting: HashMap::new(),
            in_flight: JoinSet::new(),
        };
        tokio::spawn(task.run(rx));
        Copy { tx }
    }

    /// Runs a step in the next batch that can take it: its row's token.
    pub async fn step(&self, step: Step) -> Result<SampledToken, ClientError> {
        let (reply, answer) = oneshot::channel();
        let gone = || ClientError::Connection("the copy's batching ended".into());
        self.tx.send(Msg::Step(step, reply)).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// Frees `sequence`'s state on every stage (once no step of it is in
    /// flight).
    pub fn leave(&self, sequence: u64) {
        let _ = self.tx.send(Msg::Leave(sequence));
    }
}

/// A step waiting for its batch, and where its token goes.
struct Waiting {
    step: Step,
    reply: oneshot::Sender<Result<SampledToken, ClientError>>,
}

/// A finished batch: its steps and each row's token, or why not.
struct Landed {
    batch: Vec<Waiting>,
    result: Result<Vec<SampledToken>, ClientError>,
}

struct Task {
    batcher: Batcher,
    network: Network,
    copy: u32,
    feed: Arc<Feed>,
    /// Steps asked, by sequence, until their batch goes.
    waiting: HashMap<u64, Waiting>,
    in_flight: JoinSet<Landed>,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Msg>) {
        let mut open = true;
        while open || !self.in_flight.is_empty() {
            self.launch();
            let wake = self.batcher.wake_at().map(tokio::time::Instant::from_std);
            tokio::select! {
                msg = rx.recv(), if open => match msg {
                    Some(Msg::Step(step, reply)) => {
                        let ask = Ask {
                            sequence: step.sequence,
                            fresh: matches!(step.fed, Fed::Fresh(_)),
                            past: match step.fed {
                                Fed::Decode { past, .. } => past,
                                Fed::Fresh(_) => 0,
                            },
                        };
                        self.waiting.insert(step.sequence, Waiting { step, reply });
                        self.batcher.ask(ask);
                    }
                    Some(Msg::Leave(sequence)) => {
                        self.waiting.remove(&sequence);
                        if self.batcher.leave(sequence) {
                            self.end(sequence);
                        }
                    }
                    None => open = false,
                },
                Some(landed) = self.in_flight.join_next() => {
                    if let Ok(landed) = landed {
                        self.landed(landed);
                    }
                }
                _ = tokio::time::sleep_until(wake.unwrap_or_else(tokio::time::Instant::now)),
                    if wake.is_some() => {}
            }
        }
    }

    /// Sends every batch the batcher hands out now.
    fn launch(&mut self) {
        while let Some(asks) = self.batcher.next(Instant::now()) {
            let batch: Vec<Waiting> = asks
                .iter()
                .filter_map(|a| self.waiting.remove(&a.sequence))
                .collect();
            if batch.is_empty() {
                continue;
            }
            let (network, feed, copy) = (self.network.clone(), self.feed.clone(), self.copy);
            self.in_flight
                .spawn(async move { run_batch(&network, &feed, copy, batch).await });
        }
    }

    fn landed(&mut self, Landed { batch, result }: Landed) {
        let asks: Vec<Ask> = batch
            .iter()
            .map(|w| Ask {
                sequence: w.step.sequence,
                fresh: matches!(w.step.fed, Fed::Fresh(_)),
                past: 0,
            })
            .collect();
        let mut answered = Vec::new();
        for (i, waiting) in batch.into_iter().enumerate() {
            let reply = match &result {
                Ok(tokens) => tokens.get(i).cloned().ok_or_else(|| {
                    failed(ErrorKind::Worker, "the batch's answer lost a row".into())
                }),
                Err(e) => Err(share(e)),
            };
            let ok = reply.is_ok();
            if waiting.reply.send(reply).is_ok() && ok {
                answered.push(waiting.step.sequence);
            }
        }
        for sequence in self.batcher.landed(&asks, &answered, Instant::now()) {
            self.end(sequence);
        }
    }

    /// Frees `sequence`'s state on every worker of the copy's deployment.
    fn end(&self, sequence: u64) {
        let network = self.network.clone();
        let copy = self.copy;
        tokio::spawn(async move { end_sequence(&network, copy, sequence).await });
    }
}

/// Runs `batch` as one request on copy `copy`: each row's token.
async fn run_batch(network: &Network, feed: &Feed, copy: u32, batch: Vec<Waiting>) -> Landed {
    let steps = Steps::batch(batch.iter().map(|w| row(&w.step)).collect());
    let inputs = match &batch[0].step.fed {
        // A fresh step is alone (the batcher's rule).
        Fed::Fresh(tokens) => feed.fresh(tokens),
        Fed::Decode { .. } => {
            let rows: Vec<(u32, u32)> = batch
                .iter()
                .filter_map(|w| match w.step.fed {
                    Fed::Decode { token, past } => Some((token, past)),
                    Fed::Fresh(_) => None,
                })
                .collect();
            feed.decode(&rows, steps.positions)
        }
    };
    let sampling: Vec<Sampling> = batch.iter().map(|w| w.step.sampling).collect();
    // The batch waits as long as its most patient row.
    let until = batch
        .iter()
        .map(|w| w.step.until)
        .max()
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(30));
    let result = match inputs {
        Ok(inputs) => {
            let request = infer::Request {
                inputs: &inputs,
                sequence: Some(&steps),
                sampling: &sampling,
                counters: false,
                until,
                copy: Some(copy),
            };
            network.run(request).await.and_then(|done| {
                if done.sampled.len() == batch.len() {
                    Ok(done.sampled)
                } else {
                    Err(failed(
                        ErrorKind::Worker,
                        format!("{} tokens for {} rows", done.sampled.len(), batch.len()),
                    ))
                }
            })
        }
        Err(e) => Err(failed(ErrorKind::BadInput, e.to_string())),
    };
    Landed { batch, result }
}

fn row(step: &Step) -> SequenceStep {
    let (fresh, past) = match step.fed {
        Fed::Fresh(_) => (true, 0),
        Fed::Decode { past, .. } => (false, past),
    };
    SequenceStep {
        id: step.sequence,
        step: step.number,
        fresh,
        past,
    }
}

fn failed(kind: ErrorKind, message: String) -> ClientError {
    ClientError::Failed {
        op: Operation::Generate,
        kind,
        message,
    }
}

/// The same error for each row of a failed batch.
fn share(e: &ClientError) -> ClientError {
    match e {
        ClientError::Failed { op, kind, message } => ClientError::Failed {
            op: *op,
            kind: *kind,
            message: message.clone(),
        },
        other => failed(other.kind(), other.to_string()),
    }
}

/// Tells every worker of copy `copy`'s deployment to free `sequence`'s
/// state (each on a stream of its own; a worker that is gone has nothing
/// to free).
pub async fn end_sequence(network: &Network, copy: u32, sequence: u64) {
    let Some(deployment) = network
        .routes()
        .and_then(|t| t.copies.iter().find(|c| c.index == copy).cloned())
        .and_then(|c| c.deployment)
    else {
        return;
    };
    let inner = &network.client.inner;
    let limits = inner.limits;
    for host in &deployment.hosts {
        let Ok(worker) = inner.peers.worker(&host.name, &host.data_addr).await else {
            continue;
        };
        let msg = DataRequest::EndSequence {
            deployment: deployment.id,
            sequence,
        };
        let connection = worker.connection.clone();
        tokio::spawn(async move {
            match exchange::request::<DataReply>(&connection, &msg, None, &limits, |_| {}).await {
                Ok(_) => {}
                Err(e) => tracing::debug!(sequence, "ending the sequence: {e}"),
            }
        });
    }
}
