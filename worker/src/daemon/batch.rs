//! Dynamic batching: requests waiting for one subgraph concatenated along
//! their first (batch) dimension, run once, and every output split back
//! so that each request gets exactly its own rows.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tessera_common::tensor::{Tensor, TensorError};

/// Why requests cannot run as one batch (they then run one by one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("an input without a batch dimension")]
    NoBatchDimension,
    #[error("output {output} has shape {shape:?}, not {rows} rows: it cannot be split by request")]
    NotSplittable {
        output: usize,
        shape: Vec<usize>,
        rows: usize,
    },
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// A request whose inputs have all arrived.
pub struct Ready {
    pub request: u64,
    /// Steps of sequences (never batched here: the coordinator batches
    /// them, each row with its own state).
    pub sequence: Option<tessera_common::wire::generate::Steps>,
    pub inputs: Vec<Tensor>,
    pub since: Instant,
}

/// Rows of a request: the first dimension its inputs share (`None`: some
/// input has no dimensions, they disagree, or an input's rows are not
/// whole bytes of equal length: strings, packed 4-bit types).
fn rows(inputs: &[Tensor]) -> Option<usize> {
    let first = *inputs.first()?.shape().first()?;
    inputs
        .iter()
        .all(|t| t.shape().first() == Some(&first) && t.elem().is_byte_aligned())
        .then_some(first)
}

/// Whether two requests' inputs agree on everything but the first
/// dimension (so that they concatenate).
fn compatible(a: &[Tensor], b: &[Tensor]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.elem() == y.elem()
                && x.shape().len() == y.shape().len()
                && x.shape().get(1..) == y.shape().get(1..)
        })
}

/// How many requests from the front of `ready` run as one batch: the
/// longest run, at most `max`, that concatenates (at least 1).
pub fn batchable(ready: &VecDeque<Ready>, max: usize) -> usize {
    let Some(first) = ready.front() else {
        return 0;
    };
    if first.sequence.is_some() || rows(&first.inputs).is_none() {
        return 1;
    }
    1 + ready
        .iter()
        .skip(1)
        .take(max.saturating_sub(1))
        .take_while(|r| {
            r.sequence.is_none()
                && rows(&r.inputs).is_some()
                && compatible(&first.inputs, &r.inputs)
        })
        .count()
}

/// What an actor does with its ready requests now: a pure decision, the
/// clock passed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Hand this many requests from the front to the compute thread.
    Run(usize),
    /// Hold the oldest's batch this much longer for others to join it.
    HoldFor(Duration),
    /// Nothing now: none is ready, or a smaller batch waits for the
    /// running one to end.
    Wait,
}

/// The gate for `ready` with `batching` (none: one at a time), while a
/// batch runs (`busy`) or not, at `now`. A batch queued behind a running
/// one goes only when full; an idle thread takes a batch once it is full
/// or its oldest request has waited `max_queue_delay_us`.
pub fn gate(
    ready: &VecDeque<Ready>,
    batching: Option<tessera_common::wire::control::Batching>,
    busy: bool,
    now: Instant,
) -> Gate {
    let Some(oldest) = ready.front() else {
        return Gate::Wait;
    };
    let Some(b) = batching else {
        return Gate::Run(1);
    };
    let max = b.max_batch.max(1) as usize;
    let n = batchable(ready, max);
    if n >= max {
        return Gate::Run(n);
    }
    if busy {
        return Gate::Wait;
    }
    let delay = Duration::from_micros(b.max_queue_delay_us);
    let waited = now.saturating_duration_since(oldest.since);
    if waited >= delay {
        Gate::Run(n)
    } else {
        Gate::HoldFor(delay - waited)
    }
}

/// Each input slot of `requests` concatenated along the first dimension,
/// and each request's rows.
pub fn concat(requests: &[Vec<Tensor>]) -> Result<(Vec<Tensor>, Vec<usize>), BatchError> {
    let rows: Vec<usize> = requests
        .iter()
        .map(|inputs| rows(inputs).ok_or(BatchError::NoBatchDimension))
        .collect::<Result<_, _>>()?;
    let total: usize = rows.iter().sum();
    let Some(first) = requests.first() else {
        return Ok((Vec::new(), rows));
    };
    let joined = (0..first.len())
        .map(|slot| {
            let size: usize = requests.iter().map(|r| r[slot].bytes().len()).sum();
            let mut data = BytesMut::with_capacity(size);
            for r in requests {
                data.extend_from_slice(r[slot].bytes());
            }
            let mut shape = first[slot].shape().to_vec();
            shape[0] = total;
            Ok::<_, BatchError>(Tensor::new(first[slot].elem(), shape, data.freeze())?)
        })
        .collect::<Result<_, _>>()?;
    Ok((joined, rows))
}

/// Splits each output along its first dimension by `rows`: one output
/// list per request. An output whose first dimension is not the batch's
/// total rows cannot be split (the model mixes rows, or drops the batch
/// dimension): an error.
pub fn split(outputs: Vec<Tensor>, rows: &[usize]) -> Result<Vec<Vec<Tensor>>, BatchError> {
    let total: usize = rows.iter().sum();
    let mut per_request: Vec<Vec<Tensor>> = vec![Vec::with_capacity(outputs.len()); rows.len()];
    for (i, out) in outputs.into_iter().enumerate() {
        if out.shape().first() != Some(&total) {
            return Err(BatchError::NotSplittable {
                output: i,
                shape: out.shape().to_vec(),
                rows: total,
            });
        }
        let row_bytes = out.bytes().len() / total.max(1);
        let data = out.shared_bytes();
        let mut at = 0;
        for (r, &n) in rows.iter().enumerate() {
            let mut shape = out.shape().to_vec();
            shape[0] = n;
            let part = data.slice(at..at + n * row_bytes);
            at += n * row_bytes;
            per_request[r].push(Tensor::new(out.elem(), shape, part)?);
        }
    }
    Ok(per_request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_common::wire::control::Batching;

    fn ready_at(since: Instant, n: usize) -> VecDeque<Ready> {
        (0..n)
            .map(|i| Ready {
                request: i as u64,
                sequence: None,
                inputs: vec![Tensor::from_values(vec![1, 2], &[1f32, 2.0]).unwrap()],
                since,
            })
            .collect()
    }

    #[test]
    fn the_gate_holds_a_batch_until_full_or_its_delay_is_over() {
        let t0 = Instant::now();
        let b = Some(Batching {
            max_batch: 4,
            max_queue_delay_us: 1000,
        });
        let ms = Duration::from_micros;
        assert_eq!(gate(&VecDeque::new(), b, false, t0), Gate::Wait);
        assert_eq!(gate(&ready_at(t0, 2), None, false, t0), Gate::Run(1));
        // Two of four, 400 µs in: 600 µs more.
        assert_eq!(
            gate(&ready_at(t0, 2), b, false, t0 + ms(400)),
            Gate::HoldFor(ms(600))
        );
        // The delay over: what there is goes.
        assert_eq!(
            gate(&ready_at(t0, 2), b, false, t0 + ms(1000)),
            Gate::Run(2)
        );
        // Full: at once, even while a batch runs.
        assert_eq!(gate(&ready_at(t0, 5), b, true, t0), Gate::Run(4));
        // Not full while one runs: it waits for the thread.
        assert_eq!(gate(&ready_at(t0, 2), b, true, t0 + ms(5000)), Gate::Wait);
    }

    fn t(shape: &[usize], start: f32) -> Tensor {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n).map(|i| start + i as f32).collect();
        Tensor::from_values(shape.to_vec(), &values).unwrap()
    }

    fn ready(inputs: Vec<Tensor>) -> Ready {
        Ready {
            request: 0,
            sequence: None,
            inputs,
            since: Instant::now(),
        }
    }

    #[test]
    fn requests_concatenate_and_split_back_to_their_own_rows() {
        let a = vec![t(&[1, 3], 0.0), t(&[1, 2], 100.0)];
        let b = vec![t(&[2, 3], 10.0), t(&[2, 2], 200.0)];
        let (joined, rows) = concat(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(rows, [1, 2]);
        assert_eq!(joined[0].shape(), [3, 3]);
        assert_eq!(joined[1].shape(), [3, 2]);
        let back = split(joined, &rows).unwrap();
        assert_eq!(back, vec![a, b]);
    }

    #[test]
    fn only_requests_of_matching_shapes_join_a_batch() {
        let mut queue = VecDeque::new();
        queue.push_back(ready(vec![t(&[1, 3, 4], 0.0)]));
        queue.push_back(ready(vec![t(&[1, 3, 4], 0.0)]));
        queue.push_back(ready(vec![t(&[1, 3, 5], 0.0)]));
        queue.push_back(ready(vec![t(&[1, 3, 4], 0.0)]));
        assert_eq!(batchable(&queue, 8), 2);
        assert_eq!(batchable(&queue, 1), 1);
        let mut scalar = VecDeque::new();
        scalar.push_back(ready(vec![Tensor::from_values(vec![], &[1.0f32]).unwrap()]));
        scalar.push_back(ready(vec![Tensor::from_values(vec![], &[1.0f32]).unwrap()]));
        assert_eq!(batchable(&scalar, 8), 1);
    }

    #[test]
    fn an_output_without_the_batch_rows_is_not_split() {
        let err = split(vec![t(&[4], 0.0)], &[1, 2]).unwrap_err();
        assert_eq!(
            err,
            BatchError::NotSplittable {
                output: 0,
                shape: vec![4],
                rows: 3
            }
        );
        assert!(err.to_string().contains("not 3 rows"), "{err}");
    }
}
