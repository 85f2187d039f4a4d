//! Fresh sequences waiting for room on a stage: a bounded FIFO. A stage
//! keeps state for at most `max_sequences` sequences of its network; the
//! fresh step of one more waits here (at most `max_queued` of them, each
//! at most `timeout`) until a sequence ends, and is refused as busy beyond
//! that. Decode steps of the sequences it keeps never wait here. The clock
//! is passed in; the actor does the I/O.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::batch::Ready;
use super::sequences::SequenceStore;

/// What became of a fresh step offered to the stage.
pub enum Offer {
    /// Room was reserved: it runs.
    Run(Ready),
    /// It waits for room.
    Queued,
    /// No room and no place in the queue; why.
    Busy(Ready, String),
}

/// A stage's queue of fresh sequences.
pub struct Admission {
    queue: VecDeque<(Ready, Instant)>,
    max_queued: usize,
    timeout: Duration,
}

impl Admission {
    pub fn new(max_queued: u32, timeout: Duration) -> Admission {
        Admission {
            queue: VecDeque::new(),
            max_queued: max_queued as usize,
            timeout,
        }
    }

    /// A ready request that starts sequence `sequence` (a fresh step).
    pub fn offer(
        &mut self,
        ready: Ready,
        sequence: u64,
        store: &mut SequenceStore,
        now: Instant,
    ) -> Offer {
        if self.queue.is_empty() && store.reserve(sequence) {
            return Offer::Run(ready);
        }
        if self.queue.len() >= self.max_queued {
            let why = format!(
                "{} sequences are under way and {} wait for room (the limits: max_sequences {}, max_queued {})",
                store.len(),
                self.queue.len(),
                store.max_sequences(),
                self.max_queued
            );
            return Offer::Busy(ready, why);
        }
        self.queue.push_back((ready, now + self.timeout));
        store.set_waiting(self.queue.len());
        Offer::Queued
    }

    /// Room may have come (a sequence ended) or time passed: the waiting
    /// steps that may run now, in order, and those that waited too long.
    pub fn admit(&mut self, store: &mut SequenceStore, now: Instant) -> (Vec<Ready>, Vec<Ready>) {
        let mut run = Vec::new();
        while let Some((ready, _)) = self.queue.front() {
            let sequence = ready
                .sequence
                .as_ref()
                .and_then(|s| s.first_id())
                .unwrap_or(0);
            if !store.reserve(sequence) {
                break;
            }
            if let Some((ready, _)) = self.queue.pop_front() {
                run.push(ready);
            }
        }
        let (expired, kept): (Vec<_>, Vec<_>) = self.queue.drain(..).partition(|(_, t)| *t <= now);
        self.queue = kept.into();
        store.set_waiting(self.queue.len());
        (run, expired.into_iter().map(|(r, _)| r).collect())
    }

    /// Forgets a request that waits here (cancelled).
    pub fn forget(&mut self, request: u64, store: &mut SequenceStore) {
        self.queue.retain(|(r, _)| r.request != request);
        store.set_waiting(self.queue.len());
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// How long a step may wait here.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_common::wire::generate::{SequenceStep, Steps};

    fn fresh(request: u64, sequence: u64) -> Ready {
        Ready {
            request,
            sequence: Some(Steps::one(SequenceStep {
                id: sequence,
                step: 1,
                fresh: true,
                past: 0,
            })),
            inputs: Vec::new(),
            since: Instant::now(),
        }
    }

    fn ran(offer: Offer) -> Option<u64> {
        match offer {
            Offer::Run(r) => Some(r.request),
            _ => None,
        }
    }

    #[test]
    fn sequences_beyond_the_limit_wait_in_order_then_are_refused() {
        let t = Instant::now();
        let mut store = SequenceStore::new(1);
        let mut a = Admission::new(2, Duration::from_secs(1));
        assert_eq!(ran(a.offer(fresh(1, 10), 10, &mut store, t)), Some(1));
        assert!(matches!(
            a.offer(fresh(2, 20), 20, &mut store, t),
            Offer::Queued
        ));
        assert!(matches!(
            a.offer(fresh(3, 30), 30, &mut store, t),
            Offer::Queued
        ));
        assert_eq!(store.waiting(), 2);
        assert!(matches!(
            a.offer(fresh(4, 40), 40, &mut store, t),
            Offer::Busy(..)
        ));
        // Sequence 10 ends: 20 runs, 30 still waits.
        store.end(10);
        let (run, expired) = a.admit(&mut store, t);
        assert_eq!(run.iter().map(|r| r.request).collect::<Vec<_>>(), [2]);
        assert!(expired.is_empty());
        // Its wait runs out.
        let (run, expired) = a.admit(&mut store, t + Duration::from_secs(2));
        assert!(run.is_empty());
        assert_eq!(expired.iter().map(|r| r.request).collect::<Vec<_>>(), [3]);
        assert!(a.is_empty());
        assert_eq!(store.waiting(), 0);
    }

    #[test]
    fn a_new_sequence_does_not_pass_those_that_wait() {
        let t = Instant::now();
        let mut store = SequenceStore::new(1);
        let mut a = Admission::new(4, Duration::from_secs(1));
        assert!(ran(a.offer(fresh(1, 10), 10, &mut store, t)).is_some());
        assert!(matches!(
            a.offer(fresh(2, 20), 20, &mut store, t),
            Offer::Queued
        ));
        store.end(10);
        // 30 comes after 20 and queues behind it though there is room.
        assert!(matches!(
            a.offer(fresh(3, 30), 30, &mut store, t),
            Offer::Queued
        ));
        let (run, _) = a.admit(&mut store, t);
        assert_eq!(run.iter().map(|r| r.request).collect::<Vec<_>>(), [2]);
    }
}
