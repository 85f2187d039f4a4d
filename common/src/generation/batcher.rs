//! Continuous batching of one copy's sequence steps, as a pure state
//! machine with the clock passed in. The driver (the requester) feeds it
//! each sequence's next step, sends the batches it hands out (a row per
//! sequence; each stage stacks the rows' kept state) and tells it when a
//! batch lands; it also says when a sequence's state may be freed.
//!
//! A fresh step (a prompt, or a replay after a worker loss) goes alone and
//! at once, whatever is in flight: it may wait on its stages for a
//! sequence to end (their admission queue) while the decode steps of the
//! others go on. At most as many decode batches are in flight as the copy
//! has stages, and a batch
//! takes at most its share of the live sequences (N / stages, rounded up,
//! and at most `max_rows`), so with N sequences every stage works on a
//! batch of about N / stages rows while the others work on theirs. When a
//! batch lands, the next waits (at most [`REGROUP`]) for the sequences it
//! answered to ask again, so batches do not fray into single rows.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

/// How long a batch waits for the sequences of the last one to ask again.
pub const REGROUP: Duration = Duration::from_millis(5);

/// A sequence's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub sequence: u64,
    /// Every token so far (the stages start its state afresh).
    pub fresh: bool,
    /// Positions its state holds before the step (0 when fresh).
    pub past: u32,
}

/// One copy's batching.
#[derive(Debug, Clone)]
pub struct Batcher {
    /// Batches in flight at most (the copy's stages).
    depth: usize,
    max_rows: usize,
    /// The model pads rows of different lengths (an attention mask and a
    /// positions axis on every state): any decode steps may share a batch.
    pads: bool,
    /// The model takes more than one row at all.
    batches: bool,
    queue: VecDeque<Ask>,
    in_flight: usize,
    /// Sequences with a step in flight.
    busy: HashSet<u64>,
    /// Sequences of generations under way.
    live: HashSet<u64>,
    /// Sequences that left while a step of theirs was in flight.
    ending: HashSet<u64>,
    /// Sequences answered whose next ask (or leave) has not come yet.
    returning: HashSet<u64>,
    /// Until when a batch waits for them.
    regroup_until: Option<Instant>,
}

impl Batcher {
    /// A copy of `stages` stages whose stages keep at most `max_rows`
    /// sequences; `pads` and `batches` as the model's inputs allow.
    pub fn new(stages: usize, max_rows: usize, pads: bool, batches: bool) -> Batcher {
        Batcher {
            depth: stages.max(1),
            max_rows: max_rows.max(1),
            pads,
            batches,
            queue: VecDeque::new(),
            in_flight: 0,
            busy: HashSet::new(),
            live: HashSet::new(),
            ending: HashSet::new(),
            returning: HashSet::new(),
            regroup_until: None,
        }
    }

    /// A sequence asks for its next step.
    pub fn ask(&mut self, ask: Ask) {
        self.returning.remove(&ask.sequence);
        if self.returning.is_empty() {
            self.regroup_until = None;
        }
        self.live.insert(ask.sequence);
        self.queue.push_back(ask);
    }

    /// A generation is over. `true`: free its sequence's state now;
    /// `false`: a step of it is in flight, and [`Batcher::landed`] says
    /// when.
    pub fn leave(&mut self, sequence: u64) -> bool {
        self.returning.remove(&sequence);
        if self.returning.is_empty() {
            self.regroup_until = None;
        }
        self.live.remove(&sequence);
        self.queue.retain(|a| a.sequence != sequence);
        if self.busy.contains(&sequence) {
            self.ending.insert(sequence);
            false
        } else {
            true
        }
    }

    /// The next batch to send at `now`, if one may go.
    pub fn next(&mut self, now: Instant) -> Option<Vec<Ask>> {
        if let Some(at) = self.queue.iter().position(|a| a.fresh) {
            let fresh = self.queue.remove(at)?;
            self.busy.insert(fresh.sequence);
            return Some(vec![fresh]);
        }
        if self.regroup_until.is_some_and(|t| t <= now) {
            self.regroup_until = None;
            self.returning.clear();
        }
        if self.queue.is_empty() || self.in_flight >= self.depth || self.regroup_until.is_some() {
            return None;
        }
        let share = self.live.len().div_ceil(self.depth).clamp(1, self.max_rows);
        let batch = self.take(share);
        self.busy.extend(batch.iter().map(|a| a.sequence));
        self.in_flight += 1;
        Some(batch)
    }

    /// A batch `next` gave landed; `answered` are the sequences whose rows
    /// were answered and that will ask again. Returns the sequences whose
    /// state may be freed now (they left meanwhile).
    pub fn landed(&mut self, batch: &[Ask], answered: &[u64], now: Instant) -> Vec<u64> {
        if !batch.iter().any(|a| a.fresh) {
            self.in_flight = self.in_flight.saturating_sub(1);
        }
        let mut end = Vec::new();
        for ask in batch {
            self.busy.remove(&ask.sequence);
            if self.ending.remove(&ask.sequence) {
                end.push(ask.sequence);
            }
        }
        let back: Vec<u64> = answered
            .iter()
            .copied()
            .filter(|s| self.live.contains(s))
            .collect();
        if !back.is_empty() {
            self.returning.extend(back);
            self.regroup_until = Some(now + REGROUP);
        }
        end
    }

    /// When [`Batcher::next`] may hand out a batch it does not now: the
    /// end of the wait for returning sequences.
    pub fn wake_at(&self) -> Option<Instant> {
        self.regroup_until
    }

    /// Sequences under way.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Batches in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The next batch: up to `most` waiting decode steps that can join the
    /// first (any where the model pads; those of the same length where it
    /// does not), in the order of their sequences.
    fn take(&mut self, most: usize) -> Vec<Ask> {
        let first = self.queue[0];
        if !self.batches {
            return self.queue.pop_front().into_iter().collect();
        }
        let mut batch = Vec::new();
        let mut rest = VecDeque::new();
        for ask in self.queue.drain(..) {
            let joins = !ask.fresh && (self.pads || ask.past == first.past);
            if joins && batch.len() < most {
                batch.push(ask);
            } else {
                rest.push_back(ask);
            }
        }
        self.queue = rest;
        // The same sequences in the same order each time, so that each
        // stage reads the batch's state as it kept it (no restacking).
        batch.sort_unstable_by_key(|a| a.sequence);
        batch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(sequence: u64, past: u32) -> Ask {
        Ask {
            sequence,
            fresh: false,
            past,
        }
    }

    fn fresh(sequence: u64) -> Ask {
        Ask {
            sequence,
            fresh: true,
            past: 0,
        }
    }

    fn ids(batch: &[Ask]) -> Vec<u64> {
        batch.iter().map(|a| a.sequence).collect()
    }

    #[test]
    fn a_fresh_step_goes_alone_and_at_once_and_decode_steps_batch() {
        let t = Instant::now();
        let mut b = Batcher::new(1, 8, true, true);
        b.ask(decode(2, 5));
        b.ask(decode(3, 9));
        b.ask(fresh(1));
        let first = b.next(t).unwrap();
        assert_eq!(ids(&first), [1]);
        // The fresh step may wait on its stage for room: the others go on.
        let decode_batch = b.next(t).unwrap();
        assert_eq!(ids(&decode_batch), [2, 3]);
        assert!(b.next(t).is_none(), "one decode batch per stage in flight");
        assert!(b.landed(&first, &[1], t).is_empty());
        assert!(b.landed(&decode_batch, &[2, 3], t).is_empty());
        // Sequences 1, 2, 3 were answered: the next batch waits for them ...
        b.ask(decode(1, 7));
        b.ask(decode(2, 6));
        assert!(b.next(t).is_none());
        b.ask(decode(3, 10));
        // ... and takes them together once they ask.
        assert_eq!(ids(&b.next(t).unwrap()), [1, 2, 3]);
    }

    #[test]
    fn the_wait_for_returning_sequences_ends_at_the_regroup_time() {
        let t = Instant::now();
        let mut b = Batcher::new(1, 8, true, true);
        b.ask(decode(1, 3));
        b.ask(decode(2, 3));
        let batch = b.next(t).unwrap();
        b.landed(&batch, &[1, 2], t);
        b.ask(decode(1, 4));
        assert!(b.next(t).is_none(), "2 has not asked yet");
        assert_eq!(b.wake_at(), Some(t + REGROUP));
        assert_eq!(ids(&b.next(t + REGROUP).unwrap()), [1]);
    }

    #[test]
    fn leaving_while_busy_ends_the_state_when_the_step_lands() {
        let t = Instant::now();
        let mut b = Batcher::new(1, 8, true, true);
        b.ask(decode(1, 3));
        b.ask(decode(2, 3));
        let batch = b.next(t).unwrap();
        assert!(!b.leave(2), "2 is busy: its state goes when its step lands");
        assert_eq!(b.landed(&batch, &[1, 2], t), [2]);
        // A busy sequence that left is not waited for (it never asks).
        b.ask(decode(1, 4));
        assert_eq!(ids(&b.next(t).unwrap()), [1]);
        assert!(!b.leave(1), "its new step is in flight");
        assert_eq!(b.in_flight(), 1);
    }

    #[test]
    fn a_queued_sequence_that_leaves_is_dropped_and_freed_at_once() {
        let t = Instant::now();
        let mut b = Batcher::new(1, 8, true, true);
        b.ask(decode(1, 3));
        assert!(b.leave(1));
        assert!(b.next(t).is_none());
        assert_eq!(b.live(), 0);
    }

    #[test]
    fn stages_share_the_live_sequences() {
        let t = Instant::now();
        let mut b = Batcher::new(2, 8, true, true);
        for s in 0..6 {
            b.ask(decode(s, 4));
        }
        assert_eq!(b.next(t).unwrap().len(), 3);
        assert_eq!(b.next(t).unwrap().len(), 3);
        assert!(b.next(t).is_none());
    }

    #[test]
    fn without_padding_only_equal_lengths_batch() {
        let t = Instant::now();
        let mut b = Batcher::new(1, 8, false, true);
        b.ask(decode(1, 3));
        b.ask(decode(2, 4));
        b.ask(decode(3, 3));
        assert_eq!(ids(&b.next(t).unwrap()), [1, 3]);
        let mut one = Batcher::new(1, 8, true, false);
        one.ask(decode(1, 3));
        one.ask(decode(2, 3));
        assert_eq!(
            ids(&one.next(t).unwrap()),
            [1],
            "a model without a batch dimension"
        );
    }

    #[test]
    fn a_batch_lists_its_sequences_in_order_whatever_order_they_asked_in() {
        let t = Instant::now();
        let mut b = Batcher::new(1, 8, true, true);
        for s in [5, 2, 9, 1] {
            b.ask(decode(s, 3));
        }
        let batch = b.next(t).unwrap();
        assert_eq!(ids(&batch), [1, 2, 5, 9]);
        b.landed(&batch, &[1, 2, 5, 9], t);
        for s in [9, 1, 5, 2] {
            b.ask(decode(s, 4));
        }
        assert_eq!(
            ids(&b.next(t).unwrap()),
            [1, 2, 5, 9],
            "the same order again"
        );
    }
}
