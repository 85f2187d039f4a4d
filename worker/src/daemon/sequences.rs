//! The state a worker keeps per sequence for one network: for each state
//! pair (an output fed back as an input at the next step, a decoder's KV
//! cache) whose maker runs here, the output of the sequence's last step.
//! The subgraphs that read a pair's input fill it from here at a later
//! step; the subgraph that makes its output keeps it here instead of
//! sending it anywhere. So the state never crosses the network, and a
//! pair's input may be read by several subgraphs of this worker (a
//! decoder's mask reads the cache's length, its attention the cache).
//!
//! Each kept value is the input of one step (`SequenceStep::step`): a
//! step's maker writes the next step's, its readers read their own, so a
//! reader that runs after the maker within a step still reads the step's
//! own state. A value goes once every subgraph here that reads it has
//! (the last read takes it without a copy), so between steps a sequence
//! holds one copy of its state.
//!
//! A sequence's state goes when it ends, when it has been idle too long,
//! or when its network is dropped. A worker keeps at most `max_sequences`
//! sequences of a network (0: no limit); a new one beyond that is refused
//! with an error that says so.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_common::tensor::Tensor;
use tessera_common::wire::control::StatePair;
use tessera_common::wire::generate::SequenceStep;

/// Which of a subgraph's inputs and outputs are state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateSlots {
    /// (input position, the pair's input name) of the state it reads.
    pub reads: Vec<(usize, Arc<str>)>,
    /// (output position, the pair's input name) of the state it makes.
    pub writes: Vec<(usize, Arc<str>)>,
}

impl StateSlots {
    /// The slots of `pairs` among a subgraph's `inputs` and `outputs`.
    pub fn new(inputs: &[Arc<str>], outputs: &[Arc<str>], pairs: &[StatePair]) -> StateSlots {
        let mut slots = StateSlots::default();
        for pair in pairs {
            let past: Arc<str> = pair.past.as_str().into();
            if let Some(i) = inputs.iter().position(|n| **n == *pair.past) {
                slots.reads.push((i, past.clone()));
            }
            if let Some(o) = outputs.iter().position(|n| **n == *pair.present) {
                slots.writes.push((o, past));
            }
        }
        slots
    }

    pub fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty()
    }

    /// Whether input `slot` is a state input.
    pub fn is_state_input(&self, slot: usize) -> bool {
        self.reads.iter().any(|(s, _)| *s == slot)
    }

    /// Whether output `slot` is a state output.
    pub fn is_state_output(&self, slot: usize) -> bool {
        self.writes.iter().any(|(s, _)| *s == slot)
    }
}

/// A kept value and the reads of it still to come.
struct Value {
    tensor: Tensor,
    reads_left: usize,
}

/// The state of one sequence: by step, by the pair's input name.
struct Kept {
    steps: BTreeMap<u32, HashMap<Arc<str>, Value>>,
    used: Instant,
}

/// The kept state of every sequence of one network on this worker.
pub struct SequenceStore {
    kept: HashMap<u64, Kept>,
    max_sequences: usize,
    /// Subgraphs here that read each pair's input.
    readers: HashMap<Arc<str>, usize>,
}

impl SequenceStore {
    pub fn new(max_sequences: u32) -> SequenceStore {
        SequenceStore {
            kept: HashMap::new(),
            max_sequences: max_sequences as usize,
            readers: HashMap::new(),
        }
    }

    /// Counts a subgraph with `slots` among the readers of its state.
    pub fn add_reader(&mut self, slots: &StateSlots) {
        for (_, past) in &slots.reads {
            *self.readers.entry(past.clone()).or_default() += 1;
        }
    }

    /// A step's full inputs for a subgraph with `slots`, in its order:
    /// `given` holds every input for a fresh step (which starts the
    /// sequence here, if there is room), and for a later step the inputs
    /// that are not state (in order), the state coming from the store.
    pub fn inputs(
        &mut self,
        step: SequenceStep,
        slots: &StateSlots,
        given: Vec<Tensor>,
    ) -> Result<Vec<Tensor>, String> {
        if step.fresh {
            self.start(step.id)?;
            return Ok(given);
        }
        let missing = || {
            format!(
                "sequence {} has no state for step {} on this worker (ended, idle too long, or started on another)",
                step.id, step.step
            )
        };
        let kept = self.kept.get_mut(&step.id).ok_or_else(missing)?;
        kept.used = Instant::now();
        let state = kept.steps.get_mut(&step.step).ok_or_else(missing)?;
        if slots
            .reads
            .iter()
            .any(|(_, past)| !state.contains_key(past))
        {
            return Err(missing());
        }
        let total = given.len() + slots.reads.len();
        let mut given = given.into_iter();
        let inputs = (0..total)
            .map(|slot| match slots.reads.iter().find(|(s, _)| *s == slot) {
                Some((_, past)) => read(state, past).ok_or_else(missing),
                None => given
                    .next()
                    .ok_or_else(|| "a step lacks an input".to_string()),
            })
            .collect::<Result<Vec<_>, _>>();
        if state.is_empty() {
            kept.steps.remove(&step.step);
        }
        inputs
    }

    /// Makes room for a sequence that starts (or starts again).
    fn start(&mut self, sequence: u64) -> Result<(), String> {
        if self.kept.contains_key(&sequence) {
            return Ok(());
        }
        if self.max_sequences > 0 && self.kept.len() >= self.max_sequences {
            return Err(format!(
                "this stage keeps state for {} sequences already (its limit); try again when one ends",
                self.kept.len()
            ));
        }
        self.kept.insert(
            sequence,
            Kept {
                steps: BTreeMap::new(),
                used: Instant::now(),
            },
        );
        Ok(())
    }

    /// Keeps a step's state outputs as the sequence's next step's inputs;
    /// what came before this step goes.
    pub fn keep(&mut self, step: SequenceStep, slots: &StateSlots, outputs: &[Tensor]) {
        let kept = self.kept.entry(step.id).or_insert_with(|| Kept {
            steps: BTreeMap::new(),
            used: Instant::now(),
        });
        kept.used = Instant::now();
        kept.steps.retain(|&s, _| s >= step.step);
        let next = kept.steps.entry(step.step.saturating_add(1)).or_default();
        for (slot, past) in &slots.writes {
            if let Some(t) = outputs.get(*slot) {
                let value = Value {
                    tensor: t.clone(),
                    reads_left: self.readers.get(past).copied().unwrap_or(1),
                };
                next.insert(past.clone(), value);
            }
        }
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
            .flat_map(|k| k.steps.values())
            .flat_map(|s| s.values())
            .map(|v| v.tensor.bytes().len() as u64)
            .sum()
    }
}

/// One read of `past` from a step's state: the last read takes the value.
fn read(state: &mut HashMap<Arc<str>, Value>, past: &Arc<str>) -> Option<Tensor> {
    let value = state.get_mut(past)?;
    value.reads_left = value.reads_left.saturating_sub(1);
    if value.reads_left == 0 {
        state.remove(past).map(|v| v.tensor)
    } else {
        Some(value.tensor.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: f32, n: usize) -> Tensor {
        Tensor::from_values(vec![n], &vec![v; n]).expect("tensor")
    }

    fn pair() -> [StatePair; 1] {
        [StatePair {
            present: "present".into(),
            past: "past".into(),
        }]
    }

    /// A subgraph that reads `past` (input 1) and makes `present` (output 0).
    fn both() -> StateSlots {
        let inputs: Vec<Arc<str>> = vec!["x".into(), "past".into()];
        let outputs: Vec<Arc<str>> = vec!["present".into(), "y".into()];
        StateSlots::new(&inputs, &outputs, &pair())
    }

    fn step(id: u64, step: u32, fresh: bool) -> SequenceStep {
        SequenceStep { id, step, fresh }
    }

    #[test]
    fn later_steps_take_the_kept_state_in_its_slot() {
        let slots = both();
        assert!(slots.is_state_input(1) && slots.is_state_output(0));
        let mut s = SequenceStore::new(0);
        s.add_reader(&slots);
        let given = s
            .inputs(step(7, 0, true), &slots, vec![t(1.0, 1), t(0.0, 0)])
            .expect("fresh");
        assert_eq!(given.len(), 2);
        s.keep(step(7, 0, true), &slots, &[t(2.0, 3), t(9.0, 1)]);
        assert_eq!(s.bytes(), 12);
        let inputs = s
            .inputs(step(7, 1, false), &slots, vec![t(5.0, 1)])
            .expect("next");
        assert_eq!(inputs, vec![t(5.0, 1), t(2.0, 3)]);
        // Its one reader took it: until the step keeps the next, nothing.
        assert_eq!(s.bytes(), 0);
        s.keep(step(7, 1, false), &slots, &[t(3.0, 4), t(9.0, 1)]);
        assert_eq!(s.bytes(), 16);
        assert!(s.end(7));
        let err = s
            .inputs(step(7, 1, false), &slots, vec![t(5.0, 1)])
            .unwrap_err();
        assert!(err.contains("no state for step 1"), "{err}");
    }

    #[test]
    fn a_reader_that_runs_after_the_maker_reads_its_own_step() {
        let (maker, reader) = (both(), {
            let inputs: Vec<Arc<str>> = vec!["past".into()];
            StateSlots::new(&inputs, &[], &pair())
        });
        let mut s = SequenceStore::new(0);
        s.add_reader(&maker);
        s.add_reader(&reader);
        s.keep(step(1, 0, true), &maker, &[t(1.0, 1), t(0.0, 1)]);
        // Step 1: the maker runs first and keeps step 2's state...
        s.inputs(step(1, 1, false), &maker, vec![t(0.0, 1)])
            .expect("maker");
        s.keep(step(1, 1, false), &maker, &[t(2.0, 2), t(0.0, 1)]);
        // ...and the reader still gets step 1's.
        let got = s
            .inputs(step(1, 1, false), &reader, vec![])
            .expect("reader");
        assert_eq!(got, vec![t(1.0, 1)]);
        // Both read step 1's: it is gone; step 2's waits for its readers.
        assert_eq!(s.bytes(), 8);
        let next = s.inputs(step(1, 2, false), &reader, vec![]).expect("next");
        assert_eq!(next, vec![t(2.0, 2)]);
    }

    #[test]
    fn a_full_worker_refuses_new_sequences_not_known_ones() {
        let slots = both();
        let mut s = SequenceStore::new(1);
        s.keep(step(1, 0, true), &slots, &[t(1.0, 1), t(1.0, 1)]);
        let err = s
            .inputs(step(2, 0, true), &slots, vec![t(1.0, 1), t(0.0, 0)])
            .unwrap_err();
        assert!(err.contains("keeps state for 1 sequences"), "{err}");
        // A replay of a known sequence starts afresh in its own place.
        s.inputs(step(1, 5, true), &slots, vec![t(1.0, 1), t(0.0, 0)])
            .expect("replay");
        assert_eq!(s.sweep(Duration::ZERO), 1);
        assert_eq!(s.len(), 0);
    }
}
