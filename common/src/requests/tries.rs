//! A request's tries as a pure state machine: what happens after each
//! try's outcome (done, retry elsewhere, wait to learn whether a peer was
//! lost, fail), with no I/O, so every rule is tested on its own. The async
//! driver (the requester in `tessera-client`) picks a deployment from the
//! routing table, runs a try, feeds the outcome here and does what it is
//! told.

/// Tries of one request (each after a worker loss) before it fails.
pub const MAX_ATTEMPTS: u32 = 4;

/// How one try ended, short of success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A worker it ran on was lost.
    Lost(String),
    /// A tensor could not reach a worker (lost, or merely unreachable).
    Unreachable(String),
    /// A worker reported an error running it.
    Error(String),
    /// The deadline passed; what was still missing.
    Deadline(String),
    /// A worker of the copy is too busy to take it now (its mailboxes
    /// full, or no room and no place in the queue for a fresh sequence).
    Busy(String),
    /// A worker refused it (its request or sequence belongs to another
    /// identity).
    Refused(String),
    /// A worker found its tensors malformed.
    BadInput(String),
}

/// What became of the try's deployment while the driver waited (for as
/// long as a loss takes to be noticed) after [`Next::AwaitLoss`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Re-deployed: the peer was lost and its copy healed.
    Redeployed,
    /// The copy cannot run any more, and why.
    Broken(String),
    /// Unchanged: the peer was not lost.
    Unchanged,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Try again on another deployment (not one in [`Tries::tried`]).
    Retry,
    /// Wait until the try's deployment changes or the loss would have been
    /// noticed, then call [`Tries::on_settled`] with what happened.
    AwaitLoss,
    /// The request fails.
    Fail(Verdict),
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A worker reported an error.
    Worker(String),
    /// Workers were lost and retrying did not help.
    WorkerLost(String),
    /// The deadline passed during try `request`; what was still awaited.
    Deadline { request: u64, waiting: String },
    /// Every copy was too busy to take it.
    Busy(String),
    /// A worker refused it.
    Refused(String),
    /// Its tensors are malformed.
    BadInput(String),
}

/// One request's tries so far.
#[derive(Debug, Clone)]
pub struct Tries {
    /// A step of a sequence: its state was on the lost worker, so it is
    /// never retried here (the generator replays the sequence).
    sequence: bool,
    /// The network's copies: a broken copy is retried on another.
    copies: usize,
    attempt: u32,
    /// The running try's request id and deployment.
    current: Option<(u64, u64)>,
    tried: Vec<u64>,
    /// Deployments that were too busy (each is tried once more only when
    /// every copy was).
    busy: Vec<u64>,
    /// Why the last try failed.
    last: String,
}

impl Tries {
    pub fn new(sequence: bool, copies: usize) -> Tries {
        Tries {
            sequence,
            copies,
            attempt: 0,
            current: None,
            tried: Vec::new(),
            busy: Vec::new(),
            last: String::new(),
        }
    }

    /// Deployments a try failed on: the next goes elsewhere.
    pub fn tried(&self) -> &[u64] {
        &self.tried
    }

    /// Tries started so far (a request that succeeds took this many).
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Why the last try failed ("" before any did).
    pub fn last(&self) -> &str {
        &self.last
    }

    /// A try starts as request `request` on deployment `deployment`.
    pub fn start(&mut self, request: u64, deployment: u64) {
        self.attempt += 1;
        self.current = Some((request, deployment));
    }

    /// The running try failed with `outcome`.
    pub fn on_outcome(&mut self, outcome: Outcome) -> Next {
        match outcome {
            Outcome::Error(e) => Next::Fail(Verdict::Worker(e)),
            Outcome::Deadline(waiting) => Next::Fail(Verdict::Deadline {
                request: self.current.map_or(0, |(id, _)| id),
                waiting,
            }),
            Outcome::Lost(e) => self.retry(e),
            Outcome::Unreachable(e) => {
                self.last = e;
                Next::AwaitLoss
            }
            Outcome::Busy(e) => self.busy(e),
            Outcome::Refused(e) => Next::Fail(Verdict::Refused(e)),
            Outcome::BadInput(e) => Next::Fail(Verdict::BadInput(e)),
        }
    }

    /// A busy copy: the request goes to another that was not, if any
    /// (nothing of it ran: a sequence step too); with every copy busy it
    /// fails as busy.
    fn busy(&mut self, reason: String) -> Next {
        if let Some((_, deployment)) = self.current.take() {
            self.tried.push(deployment);
            self.busy.push(deployment);
        }
        if self.busy.len() >= self.copies {
            return Next::Fail(Verdict::Busy(reason));
        }
        self.last = reason;
        Next::Retry
    }

    /// What became of the deployment after [`Next::AwaitLoss`]: retried
    /// if the peer was lost (its copy healed, or another copy remains).
    pub fn on_settled(&mut self, settled: Settled) -> Next {
        let error = std::mem::take(&mut self.last);
        match settled {
            Settled::Redeployed => self.retry(error),
            Settled::Broken(_) if self.copies > 1 => self.retry(error),
            Settled::Broken(why) => Next::Fail(Verdict::WorkerLost(format!("{error}; {why}"))),
            Settled::Unchanged => Next::Fail(Verdict::WorkerLost(error)),
        }
    }

    /// No deployment of network `network` became ready before the
    /// deadline: the request fails.
    pub fn on_no_deployment(&self, network: u64) -> Verdict {
        Verdict::Deadline {
            request: 0,
            waiting: format!(
                " (waiting for network {network} to be re-planned after: {})",
                self.last
            ),
        }
    }

    fn retry(&mut self, error: String) -> Next {
        self.last = error;
        if self.sequence {
            return Next::Fail(Verdict::WorkerLost(self.last.clone()));
        }
        if let Some((_, deployment)) = self.current.take() {
            self.tried.push(deployment);
        }
        if self.attempt >= MAX_ATTEMPTS {
            return Next::Fail(Verdict::WorkerLost(format!(
                "request failed {MAX_ATTEMPTS} times, the last: {}",
                self.last
            )));
        }
        Next::Retry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(sequence: bool, copies: usize) -> Tries {
        let mut t = Tries::new(sequence, copies);
        t.start(7, 100);
        t
    }

    #[test]
    fn a_busy_copy_sends_the_request_to_another_then_fails_as_busy() {
        let mut t = started(true, 2);
        assert_eq!(
            t.on_outcome(Outcome::Busy("queue full".into())),
            Next::Retry
        );
        assert_eq!(t.tried(), &[100]);
        t.start(8, 101);
        assert_eq!(
            t.on_outcome(Outcome::Busy("queue full too".into())),
            Next::Fail(Verdict::Busy("queue full too".into()))
        );
    }

    #[test]
    fn a_retried_request_counts_its_tries() {
        let mut t = started(false, 1);
        assert_eq!(t.attempts(), 1);
        assert_eq!(t.on_outcome(Outcome::Lost("a lost".into())), Next::Retry);
        t.start(8, 101);
        assert_eq!(t.attempts(), 2);
        assert_eq!(t.tried(), &[100]);
    }

    #[test]
    fn a_worker_error_fails_at_once() {
        let mut t = started(false, 3);
        assert_eq!(
            t.on_outcome(Outcome::Error("bad Conv".into())),
            Next::Fail(Verdict::Worker("bad Conv".into()))
        );
    }

    #[test]
    fn the_deadline_fails_naming_the_try_and_what_was_missing() {
        let mut t = started(false, 1);
        assert_eq!(
            t.on_outcome(Outcome::Deadline(" (still waiting for y)".into())),
            Next::Fail(Verdict::Deadline {
                request: 7,
                waiting: " (still waiting for y)".into()
            })
        );
    }

    #[test]
    fn a_loss_retries_elsewhere_until_the_attempts_run_out() {
        let mut t = Tries::new(false, 1);
        for attempt in 1..=MAX_ATTEMPTS {
            t.start(u64::from(attempt), 100 + u64::from(attempt));
            let next = t.on_outcome(Outcome::Lost(format!("loss {attempt}")));
            if attempt < MAX_ATTEMPTS {
                assert_eq!(next, Next::Retry);
                assert_eq!(t.tried().last(), Some(&(100 + u64::from(attempt))));
            } else {
                assert_eq!(
                    next,
                    Next::Fail(Verdict::WorkerLost(format!(
                        "request failed {MAX_ATTEMPTS} times, the last: loss {MAX_ATTEMPTS}"
                    )))
                );
            }
        }
        assert_eq!(t.tried().len(), MAX_ATTEMPTS as usize);
    }

    #[test]
    fn a_sequence_step_is_never_retried() {
        let mut t = started(true, 2);
        assert_eq!(
            t.on_outcome(Outcome::Lost("worker b was lost".into())),
            Next::Fail(Verdict::WorkerLost("worker b was lost".into()))
        );
    }

    #[test]
    fn an_unreachable_peer_waits_to_learn_whether_it_was_lost() {
        let mut t = started(false, 1);
        assert_eq!(
            t.on_outcome(Outcome::Unreachable("to b".into())),
            Next::AwaitLoss
        );
        assert_eq!(t.on_settled(Settled::Redeployed), Next::Retry);
        assert_eq!(t.last(), "to b");
        assert_eq!(t.tried(), &[100]);
    }

    #[test]
    fn an_unreachable_peer_that_was_not_lost_fails_the_request() {
        let mut t = started(false, 2);
        assert_eq!(
            t.on_outcome(Outcome::Unreachable("to b".into())),
            Next::AwaitLoss
        );
        assert_eq!(
            t.on_settled(Settled::Unchanged),
            Next::Fail(Verdict::WorkerLost("to b".into()))
        );
    }

    #[test]
    fn a_broken_copy_is_retried_on_another_copy_only() {
        let mut one = started(false, 1);
        one.on_outcome(Outcome::Unreachable("to b".into()));
        assert_eq!(
            one.on_settled(Settled::Broken("no workers".into())),
            Next::Fail(Verdict::WorkerLost("to b; no workers".into()))
        );
        let mut two = started(false, 2);
        two.on_outcome(Outcome::Unreachable("to b".into()));
        assert_eq!(
            two.on_settled(Settled::Broken("no workers".into())),
            Next::Retry
        );
    }

    #[test]
    fn no_deployment_in_time_names_the_last_failure() {
        let mut t = started(false, 1);
        t.on_outcome(Outcome::Lost("worker b was lost".into()));
        assert_eq!(
            t.on_no_deployment(3),
            Verdict::Deadline {
                request: 0,
                waiting: " (waiting for network 3 to be re-planned after: worker b was lost)"
                    .into()
            }
        );
    }
}
