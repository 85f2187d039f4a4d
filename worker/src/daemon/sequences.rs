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
//! A request may be the decode steps of several sequences at once (one
//! per row, [`Steps`]): their kept state is stacked into one batch,
//! padded to the longest, and each row's output cut back to its own
//! ([`super::state_rows`]). While the same rows step together, their
//! state stays one batch: a step of several rows keeps its state outputs
//! whole (a [`Group`]), and the next step of exactly those rows, in the
//! same order, reads them as they are, with no stacking and no cutting.
//! Only when the rows change (a sequence ends, joins or steps alone) is
//! each row cut back to its own.
//!
//! A sequence's state goes when it ends, when it has been idle too long,
//! or when its network is dropped. A worker keeps at most `max_sequences`
//! sequences of a network (0: no limit): a fresh step reserves its room
//! before it runs, and one beyond the limit waits for room
//! ([`super::admission`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_common::tensor::Tensor;
use tessera_common::wire::control::StatePair;
use tessera_common::wire::generate::{SequenceStep, Steps};

use super::state_rows;

/// A state input or output of a subgraph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Its position among the subgraph's inputs (or outputs).
    pub at: usize,
    /// The pair's input name (what the state is kept as).
    pub past: Arc<str>,
    /// The positions axis, along which rows of a batch are padded, and
    /// on which side.
    pub axis: Option<state_rows::PadAxis>,
}

/// Which of a subgraph's inputs and outputs are state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateSlots {
    /// The state it reads.
    pub reads: Vec<Slot>,
    /// The state it makes.
    pub writes: Vec<Slot>,
}

impl StateSlots {
    /// The slots of `pairs` among a subgraph's `inputs` and `outputs`.
    pub fn new(inputs: &[Arc<str>], outputs: &[Arc<str>], pairs: &[StatePair]) -> StateSlots {
        let mut slots = StateSlots::default();
        for pair in pairs {
            let slot = |at| Slot {
                at,
                past: pair.past.as_str().into(),
                axis: pair.axis.and_then(|a| usize::try_from(a).ok()).map(|axis| {
                    state_rows::PadAxis {
                        axis,
                        right: pair.pads_right,
                    }
                }),
            };
            if let Some(i) = inputs.iter().position(|n| **n == *pair.past) {
                slots.reads.push(slot(i));
            }
            if let Some(o) = outputs.iter().position(|n| **n == *pair.present) {
                slots.writes.push(slot(o));
            }
        }
        slots
    }

    pub fn is_empty(&self) -> bool {
        self.reads.is_empty() && self.writes.is_empty()
    }

    /// Whether input `slot` is a state input.
    pub fn is_state_input(&self, slot: usize) -> bool {
        self.reads.iter().any(|s| s.at == slot)
    }

    /// Whether output `slot` is a state output.
    pub fn is_state_output(&self, slot: usize) -> bool {
        self.writes.iter().any(|s| s.at == slot)
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

/// One row of a kept batch: its sequence, the step its state is the
/// input of, and its padding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GroupRow {
    id: u64,
    step: u32,
    padding: usize,
}

/// The state outputs of a step of several rows, kept whole for the next
/// step of the same rows: by the pair's input name, with its positions
/// axis.
struct Group {
    rows: Vec<GroupRow>,
    values: HashMap<Arc<str>, (Value, Option<state_rows::PadAxis>)>,
}

impl Group {
    /// The rows `steps` reads, as this group would hold them.
    fn rows_of(steps: &Steps, next: bool) -> Vec<GroupRow> {
        steps
            .rows
            .iter()
            .map(|r| GroupRow {
                id: r.id,
                step: r.step.saturating_add(u32::from(next)),
                padding: steps.positions.saturating_sub(r.past) as usize,
            })
            .collect()
    }

    fn holds(&self, id: u64) -> bool {
        self.rows.iter().any(|r| r.id == id)
    }
}

/// The kept state of every sequence of one network on this worker.
pub struct SequenceStore {
    kept: HashMap<u64, Kept>,
    /// Batches kept whole (few: one per batch in flight).
    groups: Vec<Group>,
    max_sequences: usize,
    /// Fresh sequences waiting for room (as heartbeats report it).
    waiting: usize,
    /// Subgraphs here that read each pair's input.
    readers: HashMap<Arc<str>, usize>,
}

impl SequenceStore {
    pub fn new(max_sequences: u32) -> SequenceStore {
        SequenceStore {
            kept: HashMap::new(),
            groups: Vec::new(),
            max_sequences: max_sequences as usize,
            waiting: 0,
            readers: HashMap::new(),
        }
    }

    /// Counts a subgraph with `slots` among the readers of its state.
    pub fn add_reader(&mut self, slots: &StateSlots) {
        for slot in &slots.reads {
            *self.readers.entry(slot.past.clone()).or_default() += 1;
        }
    }

    /// A request's full inputs for a subgraph with `slots`, in its order:
    /// `given` holds every input for a fresh step (which starts the
    /// sequence here, if there is room), and for later steps the inputs
    /// that are not state (in order), the state coming from the store:
    /// each row's, stacked into one batch.
    pub fn inputs(
        &mut self,
        steps: &Steps,
        slots: &StateSlots,
        given: Vec<Tensor>,
    ) -> Result<Vec<Tensor>, SequenceError> {
        if steps.fresh() {
            for row in &steps.rows {
                self.start(row.id)?;
            }
            return Ok(given);
        }
        let mut state = match self.kept_batch(steps, slots)? {
            Some(state) => state,
            None => self.stacked(steps, slots)?,
        };
        let total = given.len() + state.len();
        let mut given = given.into_iter();
        (0..total)
            .map(|at| match state.iter().position(|(s, _)| *s == at) {
                Some(i) => Ok(state.swap_remove(i).1),
                None => given.next().ok_or(SequenceError::LacksInput),
            })
            .collect()
    }

    /// The state of a step whose rows are exactly a kept batch's (same
    /// sequences, steps and padding, in order): the batch as it is.
    /// Otherwise the batches holding any of its rows are cut back into
    /// rows, and `None`.
    fn kept_batch(
        &mut self,
        steps: &Steps,
        slots: &StateSlots,
    ) -> Result<Option<Vec<(usize, Tensor)>>, SequenceError> {
        let wanted = Group::rows_of(steps, false);
        let positions = steps.positions as usize;
        let kept = &self.kept;
        let found = self.groups.iter().position(|g| {
            g.rows == wanted
                && wanted.iter().all(|r| kept.contains_key(&r.id))
                && slots.reads.iter().all(|slot| {
                    g.values.get(&slot.past).is_some_and(|(v, axis)| {
                        axis.is_none_or(|a| v.tensor.shape().get(a.axis) == Some(&positions))
                    })
                })
        });
        let Some(at) = found.filter(|_| wanted.len() > 1) else {
            let mine: Vec<usize> = (0..self.groups.len())
                .filter(|&g| wanted.iter().any(|r| self.groups[g].holds(r.id)))
                .collect();
            for g in mine.into_iter().rev() {
                let group = self.groups.swap_remove(g);
                self.cut(group)?;
            }
            return Ok(None);
        };
        for row in &steps.rows {
            if let Some(kept) = self.kept.get_mut(&row.id) {
                kept.used = Instant::now();
            }
        }
        let group = &mut self.groups[at];
        let mut state = Vec::with_capacity(slots.reads.len());
        for slot in &slots.reads {
            let Some((value, _)) = group.values.get_mut(&slot.past) else {
                return Err(missing(&steps.rows[0]));
            };
            value.reads_left = value.reads_left.saturating_sub(1);
            let tensor = match value.reads_left {
                0 => group.values.remove(&slot.past).map(|(v, _)| v.tensor),
                _ => Some(value.tensor.clone()),
            };
            state.push((slot.at, tensor.ok_or_else(|| missing(&steps.rows[0]))?));
        }
        if group.values.is_empty() {
            self.groups.swap_remove(at);
        }
        Ok(Some(state))
    }

    /// A kept batch cut back into each row's own state (rows whose
    /// sequence ended are dropped).
    fn cut(&mut self, group: Group) -> Result<(), SequenceError> {
        let rows = group.rows.len();
        for (b, row) in group.rows.iter().enumerate() {
            let Some(kept) = self.kept.get_mut(&row.id) else {
                continue;
            };
            let state = kept.steps.entry(row.step).or_default();
            for (past, (value, axis)) in &group.values {
                let tensor = state_rows::unstack(&value.tensor, b, rows, *axis, row.padding)?;
                let reads_left = value.reads_left;
                state.insert(past.clone(), Value { tensor, reads_left });
            }
        }
        Ok(())
    }

    /// Each row's state, stacked into one batch per state input.
    fn stacked(
        &mut self,
        steps: &Steps,
        slots: &StateSlots,
    ) -> Result<Vec<(usize, Tensor)>, SequenceError> {
        // Every row's state is checked before any is taken.
        for row in &steps.rows {
            let kept = self.kept.get_mut(&row.id).ok_or_else(|| missing(row))?;
            kept.used = Instant::now();
            let state = kept.steps.get(&row.step).ok_or_else(|| missing(row))?;
            if slots.reads.iter().any(|s| !state.contains_key(&s.past)) {
                return Err(missing(row));
            }
        }
        let mut state = Vec::with_capacity(slots.reads.len());
        for slot in &slots.reads {
            let rows = steps
                .rows
                .iter()
                .map(|row| self.read(row, &slot.past).ok_or_else(|| missing(row)))
                .collect::<Result<Vec<_>, _>>()?;
            // Each row must hold what the step says (the padding is sized by it).
            if let Some(axis) = slot.axis {
                for (row, t) in steps.rows.iter().zip(&rows) {
                    let held = t.shape().get(axis.axis).copied();
                    if held != Some(row.past as usize) {
                        return Err(SequenceError::Positions {
                            sequence: row.id,
                            state: slot.past.to_string(),
                            held,
                            step_says: row.past,
                        });
                    }
                }
            }
            let positions = steps.positions as usize;
            state.push((slot.at, state_rows::stack(rows, slot.axis, positions)?));
        }
        Ok(state)
    }

    /// One read of `past` by a row's step: the last read takes the value.
    fn read(&mut self, row: &SequenceStep, past: &Arc<str>) -> Option<Tensor> {
        let kept = self.kept.get_mut(&row.id)?;
        let state = kept.steps.get_mut(&row.step)?;
        let value = state.get_mut(past)?;
        value.reads_left = value.reads_left.saturating_sub(1);
        let tensor = if value.reads_left == 0 {
            state.remove(past).map(|v| v.tensor)
        } else {
            Some(value.tensor.clone())
        };
        if state.is_empty() {
            kept.steps.remove(&row.step);
        }
        tensor
    }

    /// Reserves room for `sequence` (it starts, or starts again); `false`
    /// when the store is full.
    pub fn reserve(&mut self, sequence: u64) -> bool {
        self.start(sequence).is_ok()
    }

    /// The most sequences it keeps (0: no limit).
    pub fn max_sequences(&self) -> usize {
        self.max_sequences
    }

    /// Fresh sequences waiting for room.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    pub fn set_waiting(&mut self, waiting: usize) {
        self.waiting = waiting;
    }

    /// Makes room for a sequence that starts (or starts again).
    fn start(&mut self, sequence: u64) -> Result<(), SequenceError> {
        if self.kept.contains_key(&sequence) {
            return Ok(());
        }
        if self.max_sequences > 0 && self.kept.len() >= self.max_sequences {
            return Err(SequenceError::Full(self.kept.len()));
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

    /// Keeps each row's state outputs as its sequence's next step's
    /// inputs (a step of several rows keeps them whole, for the next step
    /// of the same rows; one row's is its own); what came before the step
    /// goes. A sequence that ended meanwhile keeps nothing.
    pub fn keep(
        &mut self,
        steps: &Steps,
        slots: &StateSlots,
        outputs: &[Tensor],
    ) -> Result<(), SequenceError> {
        if steps.rows.len() > 1 {
            return self.keep_whole(steps, slots, outputs);
        }
        for (b, row) in steps.rows.iter().enumerate() {
            let Some(kept) = self.kept.get_mut(&row.id) else {
                continue;
            };
            kept.used = Instant::now();
            kept.steps.retain(|&s, _| s >= row.step);
            let padding = steps.positions.saturating_sub(row.past) as usize;
            let mut next = HashMap::new();
            for slot in &slots.writes {
                let t = outputs
                    .get(slot.at)
                    .ok_or(SequenceError::NoOutput(slot.at))?;
                let rows = steps.rows.len();
                let value = Value {
                    tensor: state_rows::unstack(t, b, rows, slot.axis, padding)?,
                    reads_left: self.readers.get(&slot.past).copied().unwrap_or(1),
                };
                next.insert(slot.past.clone(), value);
            }
            kept.steps
                .entry(row.step.saturating_add(1))
                .or_default()
                .extend(next);
        }
        Ok(())
    }

    /// [`SequenceStore::keep`] for a step of several rows: its state
    /// outputs kept whole, as a batch for the next step of these rows.
    fn keep_whole(
        &mut self,
        steps: &Steps,
        slots: &StateSlots,
        outputs: &[Tensor],
    ) -> Result<(), SequenceError> {
        let now = Instant::now();
        for row in &steps.rows {
            if let Some(kept) = self.kept.get_mut(&row.id) {
                kept.used = now;
                kept.steps.retain(|&s, _| s >= row.step);
            }
        }
        // Batches of these sequences from before the step go too.
        self.groups.retain(|g| {
            !g.rows
                .iter()
                .any(|r| (steps.rows.iter()).any(|row| row.id == r.id && r.step < row.step))
        });
        if !steps.rows.iter().any(|r| self.kept.contains_key(&r.id)) {
            return Ok(());
        }
        let rows = Group::rows_of(steps, true);
        let at = match self.groups.iter().position(|g| g.rows == rows) {
            Some(at) => at,
            None => {
                self.groups.push(Group {
                    rows,
                    values: HashMap::new(),
                });
                self.groups.len() - 1
            }
        };
        for slot in &slots.writes {
            let tensor = outputs
                .get(slot.at)
                .ok_or(SequenceError::NoOutput(slot.at))?
                .clone();
            if tensor.shape().first() != Some(&steps.rows.len()) {
                return Err(state_rows::StateRowsError::WrongRows {
                    shape: tensor.shape().to_vec(),
                    rows: steps.rows.len(),
                }
                .into());
            }
            let reads_left = self.readers.get(&slot.past).copied().unwrap_or(1);
            let value = Value { tensor, reads_left };
            self.groups[at]
                .values
                .insert(slot.past.clone(), (value, slot.axis));
        }
        Ok(())
    }

    /// Forgets a sequence's state (a batch that held it stays for its
    /// other rows while any of them is kept).
    pub fn end(&mut self, sequence: u64) -> bool {
        let ended = self.kept.remove(&sequence).is_some();
        self.drop_orphan_groups();
        ended
    }

    /// Forgets the state of sequences idle for `idle` or longer at `now`;
    /// how many.
    pub fn sweep(&mut self, idle: Duration, now: Instant) -> usize {
        let before = self.kept.len();
        self.kept
            .retain(|_, k| now.saturating_duration_since(k.used) < idle);
        self.drop_orphan_groups();
        before - self.kept.len()
    }

    /// Drops the kept batches none of whose sequences is kept.
    fn drop_orphan_groups(&mut self) {
        let kept = &self.kept;
        self.groups
            .retain(|g| g.rows.iter().any(|r| kept.contains_key(&r.id)));
    }

    /// Sequences with state here.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Bytes of state kept.
    pub fn bytes(&self) -> u64 {
        let rows: u64 = self
            .kept
            .values()
            .flat_map(|k| k.steps.values())
            .flat_map(|s| s.values())
            .map(|v| v.tensor.bytes().len() as u64)
            .sum();
        let batches: u64 = (self.groups.iter())
            .flat_map(|g| g.values.values())
            .map(|(v, _)| v.tensor.bytes().len() as u64)
            .sum();
        rows + batches
    }
}

/// The error for a row whose state is not here.
fn missing(row: &SequenceStep) -> SequenceError {
    SequenceError::NoState {
        sequence: row.id,
        step: row.step,
    }
}

/// Why a step of a sequence cannot take or keep its state here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    #[error("sequence {sequence} has no state for step {step} on this worker (ended, idle too long, or started on another)")]
    NoState { sequence: u64, step: u32 },
    #[error(
        "sequence {sequence} holds {held:?} positions of '{state}' here, the step says {step_says}"
    )]
    Positions {
        sequence: u64,
        state: String,
        held: Option<usize>,
        step_says: u32,
    },
    #[error(
        "this stage keeps state for {0} sequences already (its limit); try again when one ends"
    )]
    Full(usize),
    #[error("a step lacks an input")]
    LacksInput,
    #[error("the step made no output {0}")]
    NoOutput(usize),
    #[error(transparent)]
    Rows(#[from] super::state_rows::StateRowsError),
}

#[cfg(test)]
mod tests;
