//! The sequence store's tests: slots, groups, rows and their errors.

use super::*;

fn t(v: f32, n: usize) -> Tensor {
    Tensor::from_values(vec![n], &vec![v; n]).expect("tensor")
}

fn pair(axis: Option<u32>) -> [StatePair; 1] {
    [StatePair {
        present: "present".into(),
        past: "past".into(),
        axis,
        pads_right: false,
    }]
}

/// A subgraph that reads `past` (input 1) and makes `present` (output 0).
fn both() -> StateSlots {
    let inputs: Vec<Arc<str>> = vec!["x".into(), "past".into()];
    let outputs: Vec<Arc<str>> = vec!["present".into(), "y".into()];
    StateSlots::new(&inputs, &outputs, &pair(None))
}

fn row(id: u64, step: u32, fresh: bool, past: u32) -> SequenceStep {
    SequenceStep {
        id,
        step,
        fresh,
        past,
    }
}

fn step(id: u64, step: u32, fresh: bool) -> Steps {
    Steps::one(row(id, step, fresh, 0))
}

#[test]
fn later_steps_take_the_kept_state_in_its_slot() {
    let slots = both();
    assert!(slots.is_state_input(1) && slots.is_state_output(0));
    let mut s = SequenceStore::new(0);
    s.add_reader(&slots);
    let given = s
        .inputs(&step(7, 0, true), &slots, vec![t(1.0, 1), t(0.0, 0)])
        .expect("fresh");
    assert_eq!(given.len(), 2);
    s.keep(&step(7, 0, true), &slots, &[t(2.0, 3), t(9.0, 1)])
        .expect("kept");
    assert_eq!(s.bytes(), 12);
    let inputs = s
        .inputs(&step(7, 1, false), &slots, vec![t(5.0, 1)])
        .expect("next");
    assert_eq!(inputs, vec![t(5.0, 1), t(2.0, 3)]);
    // Its one reader took it: until the step keeps the next, nothing.
    assert_eq!(s.bytes(), 0);
    s.keep(&step(7, 1, false), &slots, &[t(3.0, 4), t(9.0, 1)])
        .expect("kept");
    assert_eq!(s.bytes(), 16);
    assert!(s.end(7));
    let err = s
        .inputs(&step(7, 1, false), &slots, vec![t(5.0, 1)])
        .unwrap_err();
    assert!(
        matches!(err, SequenceError::NoState { step: 1, .. }),
        "{err}"
    );
    // A step that finishes after its sequence ended keeps nothing.
    s.keep(&step(7, 1, false), &slots, &[t(3.0, 4), t(9.0, 1)])
        .expect("nothing to keep");
    assert_eq!((s.len(), s.bytes()), (0, 0));
}

#[test]
fn a_reader_that_runs_after_the_maker_reads_its_own_step() {
    let (maker, reader) = (both(), {
        let inputs: Vec<Arc<str>> = vec!["past".into()];
        StateSlots::new(&inputs, &[], &pair(None))
    });
    let mut s = SequenceStore::new(0);
    s.add_reader(&maker);
    s.add_reader(&reader);
    s.inputs(&step(1, 0, true), &maker, vec![t(0.0, 1), t(0.0, 0)])
        .expect("fresh");
    s.keep(&step(1, 0, true), &maker, &[t(1.0, 1), t(0.0, 1)])
        .expect("kept");
    // Step 1: the maker runs first and keeps step 2's state...
    s.inputs(&step(1, 1, false), &maker, vec![t(0.0, 1)])
        .expect("maker");
    s.keep(&step(1, 1, false), &maker, &[t(2.0, 2), t(0.0, 1)])
        .expect("kept");
    // ...and the reader still gets step 1's.
    let got = s
        .inputs(&step(1, 1, false), &reader, vec![])
        .expect("reader");
    assert_eq!(got, vec![t(1.0, 1)]);
    // Both read step 1's: it is gone; step 2's waits for its readers.
    assert_eq!(s.bytes(), 8);
    let next = s.inputs(&step(1, 2, false), &reader, vec![]).expect("next");
    assert_eq!(next, vec![t(2.0, 2)]);
}

#[test]
fn a_full_worker_refuses_new_sequences_not_known_ones() {
    let slots = both();
    let mut s = SequenceStore::new(1);
    s.inputs(&step(1, 0, true), &slots, vec![t(1.0, 1), t(0.0, 0)])
        .expect("first");
    let err = s
        .inputs(&step(2, 0, true), &slots, vec![t(1.0, 1), t(0.0, 0)])
        .unwrap_err();
    assert_eq!(err, SequenceError::Full(1));
    assert!(
        err.to_string().contains("keeps state for 1 sequences"),
        "{err}"
    );
    // A replay of a known sequence starts afresh in its own place.
    s.inputs(&step(1, 5, true), &slots, vec![t(1.0, 1), t(0.0, 0)])
        .expect("replay");
    assert_eq!(s.sweep(Duration::ZERO, Instant::now()), 1);
    assert_eq!(s.len(), 0);
}

#[test]
fn a_sweep_forgets_only_sequences_idle_long_enough_at_the_clock_given() {
    let slots = both();
    let mut s = SequenceStore::new(0);
    s.inputs(&step(1, 0, true), &slots, vec![t(1.0, 1), t(0.0, 0)])
        .expect("first");
    let used = Instant::now();
    let idle = Duration::from_secs(10);
    assert_eq!(s.sweep(idle, used), 0);
    assert_eq!(s.sweep(idle, used + Duration::from_secs(9)), 0);
    assert_eq!(s.len(), 1);
    assert_eq!(s.sweep(idle, used + idle), 1);
    assert_eq!(s.len(), 0);
}

/// `[1, 1, positions, 1]` state holding `v` at each position.
fn positions(v: f32, n: usize) -> Tensor {
    Tensor::from_values(vec![1, 1, n, 1], &vec![v; n]).expect("tensor")
}

/// A store whose one subgraph reads `past` (input 1, positions along
/// axis 2) and makes `present`, and sequences `(id, n)` that each
/// kept `n` positions holding `id` from their fresh step.
fn store_with(sequences: &[(u64, usize)]) -> (SequenceStore, StateSlots) {
    let inputs: Vec<Arc<str>> = vec!["x".into(), "past".into()];
    let outputs: Vec<Arc<str>> = vec!["present".into()];
    let slots = StateSlots::new(&inputs, &outputs, &pair(Some(2)));
    let mut s = SequenceStore::new(0);
    s.add_reader(&slots);
    for &(id, n) in sequences {
        let fresh = step(id, 0, true);
        s.inputs(&fresh, &slots, vec![t(0.0, 1), positions(0.0, 0)])
            .expect("fresh");
        s.keep(&fresh, &slots, &[positions(id as f32, n)])
            .expect("kept");
    }
    (s, slots)
}

#[test]
fn decode_steps_of_several_sequences_run_as_one_padded_batch() {
    // Two sequences, prompts of 1 and 3 positions.
    let (mut s, slots) = store_with(&[(1, 1), (2, 3)]);
    let batch = Steps::batch(vec![row(2, 1, false, 3), row(1, 1, false, 1)]);
    let inputs = s.inputs(&batch, &slots, vec![t(0.0, 2)]).expect("batched");
    assert_eq!(inputs[1].shape(), [2, 1, 3, 1]);
    assert_eq!(
        inputs[1].float_values().expect("floats"),
        [2.0, 2.0, 2.0, 0.0, 0.0, 1.0]
    );
    // The step adds a position to each row; each keeps its own.
    let present = Tensor::from_values(
        vec![2, 1, 4, 1],
        &[2.0f32, 2.0, 2.0, 20.0, 0.0, 0.0, 1.0, 10.0],
    )
    .expect("tensor");
    s.keep(&batch, &slots, &[present]).expect("kept");
    let alone = s
        .inputs(&Steps::one(row(1, 2, false, 2)), &slots, vec![t(0.0, 1)])
        .expect("sequence 1");
    assert_eq!(
        alone[1],
        Tensor::from_values(vec![1, 1, 2, 1], &[1.0f32, 10.0]).expect("t")
    );
    let err = s
        .inputs(
            &Steps::batch(vec![row(2, 2, false, 4), row(1, 2, false, 2)]),
            &slots,
            vec![],
        )
        .unwrap_err();
    assert_eq!(
        err,
        SequenceError::NoState {
            sequence: 1,
            step: 2
        }
    );
}

#[test]
fn a_step_that_misstates_a_sequences_length_is_refused() {
    let (mut s, slots) = store_with(&[(1, 3)]);
    // Three positions kept; a step that says 1000 would pad to them.
    let err = s
        .inputs(&Steps::one(row(1, 1, false, 1000)), &slots, vec![t(0.0, 1)])
        .unwrap_err();
    assert!(
        matches!(err, SequenceError::Positions { held: Some(3), .. }),
        "{err}"
    );
}

/// A `[2, 1, positions, 1]` state output of a batch step.
fn two_rows(a: &[f32], b: &[f32]) -> Tensor {
    let values: Vec<f32> = a.iter().chain(b).copied().collect();
    Tensor::from_values(vec![2, 1, a.len(), 1], &values).expect("tensor")
}

#[test]
fn the_same_rows_stepping_again_read_their_batch_as_it_was_kept() {
    let (mut s, slots) = store_with(&[(1, 1), (2, 3)]);
    let step1 = Steps::batch(vec![row(1, 1, false, 1), row(2, 1, false, 3)]);
    s.inputs(&step1, &slots, vec![t(0.0, 2)]).expect("stacked");
    let present = two_rows(&[0.0, 0.0, 1.0, 10.0], &[2.0, 2.0, 2.0, 20.0]);
    s.keep(&step1, &slots, std::slice::from_ref(&present))
        .expect("kept whole");
    assert_eq!(s.bytes(), present.bytes().len() as u64);
    // The same rows, in the same order, one step on: the very tensor.
    let step2 = Steps::batch(vec![row(1, 2, false, 2), row(2, 2, false, 4)]);
    let inputs = s.inputs(&step2, &slots, vec![t(0.0, 2)]).expect("whole");
    assert_eq!(inputs[1], present);
    assert_eq!(
        inputs[1].bytes().as_ptr(),
        present.bytes().as_ptr(),
        "no copy"
    );
    assert_eq!(s.bytes(), 0, "its one reader took it");
    let next = two_rows(&[0.0, 0.0, 1.0, 10.0, 11.0], &[2.0, 2.0, 2.0, 20.0, 21.0]);
    s.keep(&step2, &slots, &[next]).expect("kept whole");
    // Sequence 2 ends: sequence 1 steps alone with its own positions.
    assert!(s.end(2));
    let alone = s
        .inputs(&Steps::one(row(1, 3, false, 3)), &slots, vec![t(0.0, 1)])
        .expect("cut back");
    assert_eq!(alone[1], positions_of(&[1.0, 10.0, 11.0]));
    assert_eq!(s.bytes(), 0);
}

#[test]
fn rows_in_another_order_or_company_are_cut_back_and_stacked_anew() {
    let (mut s, slots) = store_with(&[(1, 2), (2, 2), (3, 2)]);
    let step1 = Steps::batch(vec![row(1, 1, false, 2), row(2, 1, false, 2)]);
    s.inputs(&step1, &slots, vec![t(0.0, 2)]).expect("stacked");
    let present = two_rows(&[1.0, 1.0, 10.0], &[2.0, 2.0, 20.0]);
    s.keep(&step1, &slots, &[present]).expect("kept whole");
    // Sequence 3 joins: three rows, each its own state.
    let step2 = Steps::batch(vec![
        row(3, 1, false, 2),
        row(2, 2, false, 3),
        row(1, 2, false, 3),
    ]);
    let inputs = s
        .inputs(&step2, &slots, vec![t(0.0, 3)])
        .expect("restacked");
    assert_eq!(inputs[1].shape(), [3, 1, 3, 1]);
    assert_eq!(
        inputs[1].float_values().expect("floats"),
        [0.0, 3.0, 3.0, 2.0, 2.0, 20.0, 1.0, 1.0, 10.0]
    );
    // A row the batch does not hold is refused as before.
    let err = s
        .inputs(
            &Steps::batch(vec![row(1, 2, false, 3), row(4, 2, false, 3)]),
            &slots,
            vec![],
        )
        .unwrap_err();
    assert!(matches!(err, SequenceError::NoState { .. }), "{err}");
}

#[test]
fn a_kept_batch_goes_with_the_last_of_its_sequences() {
    let (mut s, slots) = store_with(&[(1, 1), (2, 1)]);
    let step1 = Steps::batch(vec![row(1, 1, false, 1), row(2, 1, false, 1)]);
    s.inputs(&step1, &slots, vec![t(0.0, 2)]).expect("stacked");
    s.keep(&step1, &slots, &[two_rows(&[1.0, 1.0], &[2.0, 2.0])])
        .expect("kept whole");
    assert!(s.bytes() > 0);
    s.end(1);
    assert!(s.bytes() > 0, "sequence 2 still needs its row");
    s.end(2);
    assert_eq!((s.len(), s.bytes()), (0, 0));
}

fn positions_of(v: &[f32]) -> Tensor {
    Tensor::from_values(vec![1, 1, v.len(), 1], v).expect("tensor")
}
