//! The state a subgraph keeps per sequence: for each state pair it owns
//! (an output fed back as an input at the next step, a decoder's KV
//! cache), the output of the sequence's last step. The compute thread
//! fills the state inputs of a step from here and keeps its state outputs
//! here instead of sending them anywhere, so the state never crosses the
//! network; the steps of one sequence run in order on that one thread.
//!
//! A sequence's state goes when it ends, when it has been idle too long,
//! or when its stage is dropped. A stage keeps at most `max_sequences`
//! (0: no limit); a new sequence beyond that is refused with an error that
//! says so.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_common::tensor::Tensor;
use tessera_common::wire::control::StatePair;
use tessera_common::wire::generate::SequenceStep;

/// Which of a subgraph's inputs and outputs are state, pair by pair.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateSlots {
    /// Input positions of the pairs' past sides.
    pub inputs: Vec<usize>,
    /// Output positions of the pairs' present sides, in the same order.
    pub outputs: Vec<usize>,
}

impl StateSlots {
    /// The slots of `pairs` among a subgraph's `inputs` and `outputs`; an
    /// error names a pair the subgraph does not hold both sides of.
    pub fn new(
        inputs: &[Arc<str>],
        outputs: &[Arc<str>],
        pairs: &[StatePair],
    ) -> Result<StateSlots, String> {
        let mut slots = StateSlots::default();
        for pair in pairs {
            let input = inputs.iter().position(|n| **n == *pair.past);
            let output = outputs.iter().position(|n| **n == *pair.present);
            match (input, output) {
                (Some(i), Some(o)) => {
                    slots.inputs.push(i);
                    slots.outputs.push(o);
                }
                _ => {
                    return Err(format!(
                        "state pair {} → {}: this subgraph does not hold both sides",
                        pair.present, pair.past
                    ))
                }
            }
        }
        Ok(slots)
    }

    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }

    /// Whether input `slot` is a state input.
    pub fn is_state_input(&self, slot: usize) -> bool {
        self.inputs.contains(&slot)
    }

    /// Whether output `slot` is a state output.
    pub fn is_state_output(&self, slot: usize) -> bool {
        self.outputs.contains(&slot)
    }
}

struct Kept {
    /// The state inputs of the next step, in pair order.
    tensors: Vec<Tensor>,
    used: Instant,
}

/// The kept state of every sequence of one subgraph.
pub struct SequenceStore {
    slots: StateSlots,
    kept: HashMap<u64, Kept>,
    max_sequences: usize,
}

impl SequenceStore {
    pub fn new(slots: StateSlots, max_sequences: u32) -> SequenceStore {
        SequenceStore {
            slots,
            kept: HashMap::new(),
            max_sequences: max_sequences as usize,
        }
    }

    pub fn slots(&self) -> &StateSlots {
        &self.slots
    }

    /// A step's full inputs in the subgraph's order: `given` holds every
    /// input for a fresh step, and for a later step the inputs that are
    /// not state (in order), the state coming from the previous step.
    pub fn inputs(
        &mut self,
        step: SequenceStep,
        given: Vec<Tensor>,
    ) -> Result<Vec<Tensor>, String> {
        if step.fresh {
            let starts = !self.kept.contains_key(&step.id);
            if starts && self.max_sequences > 0 && self.kept.len() >= self.max_sequences {
                return Err(format!(
                    "this stage keeps state for {} sequences already (its limit); try again when one ends",
                    self.kept.len()
                ));
            }
            return Ok(given);
        }
        let kept = self.kept.get_mut(&step.id).ok_or_else(|| {
            format!(
                "sequence {} has no state on this stage (ended, idle too long, or started on another)",
                step.id
            )
        })?;
        kept.used = Instant::now();
        let total = given.len() + self.slots.inputs.len();
        let mut given = given.into_iter();
        (0..total)
            .map(
                |slot| match self.slots.inputs.iter().position(|&s| s == slot) {
                    Some(pair) => Ok(kept.tensors[pair].clone()),
                    None => given
                        .next()
                        .ok_or_else(|| "a step lacks an input".to_string()),
                },
            )
            .collect()
    }

    /// Keeps a step's state outputs for the sequence's next step.
    pub fn keep(&mut self, sequence: u64, outputs: &[Tensor]) {
        let tensors = self
            .slots
            .outputs
            .iter()
            .filter_map(|&o| outputs.get(o).cloned())
            .collect();
        self.kept.insert(
            sequence,
            Kept {
                tensors,
                used: Instant::now(),
            },
        );
    }

    /// Forgets a sequence's state.
    pub fn end(&mut self, sequence: u64) -> bool {
        self.kept.remove(&sequence).is_some()
    }

    /// Forgets the state of sequences idle for `idle` or longer; how many.
    pub fn sweep(&mut self, idle: Duration) -> usize {
        let before = self.kept.len();
        self.kept.retain(|_, k| k.used.elapsed() < idle);
        before - self.kept.len()
    }

    /// Sequences with state here.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Bytes of state kept.
    pub fn bytes(&self) -> u64 {
        self.kept
            .values()
            .flat_map(|k| &k.tensors)
            .map(|t| t.bytes().len() as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: f32, n: usize) -> Tensor {
        Tensor::from_values(vec![n], &vec![v; n]).expect("tensor")
    }

    fn store(max: u32) -> SequenceStore {
        let inputs: Vec<Arc<str>> = vec!["x".into(), "past".into()];
        let outputs: Vec<Arc<str>> = vec!["present".into(), "y".into()];
        let pairs = [StatePair {
            present: "present".into(),
            past: "past".into(),
        }];
        let slots = StateSlots::new(&inputs, &outputs, &pairs).expect("slots");
        assert_eq!(slots.inputs, vec![1]);
        assert_eq!(slots.outputs, vec![0]);
        SequenceStore::new(slots, max)
    }

    #[test]
    fn later_steps_take_the_kept_state_in_its_slot() {
        let mut s = store(0);
        let fresh = SequenceStep { id: 7, fresh: true };
        let given = s.inputs(fresh, vec![t(1.0, 1), t(0.0, 0)]).expect("fresh");
        assert_eq!(given.len(), 2);
        s.keep(7, &[t(2.0, 3), t(9.0, 1)]);
        let next = SequenceStep {
            id: 7,
            fresh: false,
        };
        let inputs = s.inputs(next, vec![t(5.0, 1)]).expect("next");
        assert_eq!(inputs, vec![t(5.0, 1), t(2.0, 3)]);
        assert_eq!(s.bytes(), 12);
        assert!(s.end(7));
        let err = s.inputs(next, vec![t(5.0, 1)]).unwrap_err();
        assert!(err.contains("no state on this stage"), "{err}");
    }

    #[test]
    fn a_full_stage_refuses_new_sequences_not_known_ones() {
        let mut s = store(1);
        s.keep(1, &[t(1.0, 1), t(1.0, 1)]);
        let err = s
            .inputs(
                SequenceStep { id: 2, fresh: true },
                vec![t(1.0, 1), t(0.0, 0)],
            )
            .unwrap_err();
        assert!(err.contains("keeps state for 1 sequences"), "{err}");
        // A replay of a known sequence starts afresh in its own place.
        s.inputs(
            SequenceStep { id: 1, fresh: true },
            vec![t(1.0, 1), t(0.0, 0)],
        )
        .expect("replay");
        assert_eq!(s.sweep(Duration::ZERO), 1);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn a_pair_whose_sides_are_elsewhere_is_refused() {
        let pairs = [StatePair {
            present: "present".into(),
            past: "past".into(),
        }];
        let err = StateSlots::new(&["past".into()], &["y".into()], &pairs).unwrap_err();
        assert!(err.contains("does not hold both sides"), "{err}");
    }
}
