//! Kept state of several sequences as one batch and back: each sequence's
//! state (batch 1) padded with zeros to the batch's positions along its
//! positions axis and stacked along the first axis; after the step, each
//! row cut back to its own positions (the padding dropped). The attention
//! mask the requester sends masks the padded positions, so they change
//! nothing.
//!
//! The padding goes before a row's positions (left, the default: the
//! step's new position is the last of every row) or after them (right,
//! where the model says so: it appends at each row's own length, which
//! it reads from the mask, so a short row does not read the longest
//! row's positions). A row keeps the same bytes as it would alone: the
//! padding only adds zeros, and the cut takes the row's own positions
//! (old ones and the step's new one).

use bytes::{Bytes, BytesMut};
use tessera_common::onnx::ElemType;
use tessera_common::tensor::{Tensor, TensorError};

/// Why sequences' state cannot be stacked into a batch or cut back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateRowsError {
    #[error("no rows to stack")]
    NoRows,
    #[error("state of shape {shape:?} has no positions axis {axis}")]
    NoPositionsAxis { shape: Vec<usize>, axis: usize },
    #[error("state of type {0} cannot be padded")]
    NotPaddable(ElemType),
    #[error("sequence states of shapes {first:?} and {other:?} do not batch")]
    DoNotBatch {
        first: Vec<usize>,
        other: Vec<usize>,
    },
    #[error("a sequence's state holds {own} positions, more than the batch's {positions}")]
    TooManyPositions { own: usize, positions: usize },
    #[error("a state output of shape {shape:?} has not the request's {rows} rows")]
    WrongRows { shape: Vec<usize>, rows: usize },
    #[error("a state output of {rows} rows has no row {row}")]
    NoSuchRow { rows: usize, row: usize },
    #[error("{padding} padded positions of {positions}")]
    Overpadded { padding: usize, positions: usize },
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// The positions axis of a kept state, and on which side of a row's own
/// positions a batch pads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PadAxis {
    pub axis: usize,
    /// After the row's positions (the model appends at each row's own
    /// length), not before them.
    pub right: bool,
}

impl PadAxis {
    /// Where a row's own `own` positions start among `positions`.
    fn start(self, own: usize, positions: usize) -> usize {
        if self.right {
            0
        } else {
            positions - own
        }
    }
}

/// A tensor's layout around its positions axis, in bytes: `outer` blocks
/// (the dimensions between the batch and the axis) of `positions` runs of
/// `inner` bytes each.
struct Layout {
    outer: usize,
    inner: usize,
}

fn layout(t: &Tensor, axis: usize) -> Result<Layout, StateRowsError> {
    let shape = t.shape();
    if axis == 0 || axis >= shape.len() {
        return Err(StateRowsError::NoPositionsAxis {
            shape: shape.to_vec(),
            axis,
        });
    }
    let elem = t
        .elem()
        .size_bytes()
        .filter(|_| t.elem().is_byte_aligned())
        .and_then(|b| usize::try_from(b).ok())
        .ok_or(StateRowsError::NotPaddable(t.elem()))?;
    Ok(Layout {
        outer: shape[1..axis].iter().product(),
        inner: shape[axis + 1..].iter().product::<usize>() * elem,
    })
}

/// Rows of one sequence each (`[1, …, own positions, …]`) as one
/// `[rows, …, positions, …]` tensor, each padded with zeros along `pad`'s
/// axis to `positions`, on its side. Without an axis every row must
/// already hold `positions` (they are only stacked). One row that needs
/// no padding is passed through without a copy.
pub fn stack(
    rows: Vec<Tensor>,
    pad: Option<PadAxis>,
    positions: usize,
) -> Result<Tensor, StateRowsError> {
    let axis = pad.map(|p| p.axis);
    let first = rows.first().ok_or(StateRowsError::NoRows)?;
    let own = |t: &Tensor| axis.and_then(|a| t.shape().get(a).copied());
    if rows.len() == 1 && axis.is_none_or(|_| own(first) == Some(positions)) {
        return rows.into_iter().next().ok_or(StateRowsError::NoRows);
    }
    // Every row one sequence's, agreeing with the first but along `axis`.
    let agrees = |t: &Tensor| {
        t.elem() == first.elem()
            && t.shape().len() == first.shape().len()
            && t.shape().first() == Some(&1)
            && (t.shape().iter().zip(first.shape()).enumerate())
                .all(|(i, (a, b))| Some(i) == axis || a == b)
    };
    if let Some(t) = rows.iter().find(|t| !agrees(t)) {
        return Err(StateRowsError::DoNotBatch {
            first: first.shape().to_vec(),
            other: t.shape().to_vec(),
        });
    }
    let mut shape = first.shape().to_vec();
    let Some(pad) = pad else {
        // Nothing to pad along: the rows must agree exactly.
        shape[0] = rows.len();
        let mut data = BytesMut::with_capacity(rows.iter().map(|t| t.bytes().len()).sum());
        for t in &rows {
            data.extend_from_slice(t.bytes());
        }
        return Ok(Tensor::new(first.elem(), shape, data.freeze())?);
    };
    let axis = pad.axis;
    let Layout { outer, inner } = layout(first, axis)?;
    shape[0] = rows.len();
    shape[axis] = positions;
    let mut data = BytesMut::zeroed(rows.len() * outer * positions * inner);
    for (b, t) in rows.iter().enumerate() {
        let own = t.shape()[axis];
        if own > positions {
            return Err(StateRowsError::TooManyPositions { own, positions });
        }
        let run = own * inner;
        for o in 0..outer {
            let from = o * run;
            let to = ((b * outer + o) * positions + pad.start(own, positions)) * inner;
            data[to..to + run].copy_from_slice(&t.bytes()[from..from + run]);
        }
    }
    Ok(Tensor::new(first.elem(), shape, data.freeze())?)
}

/// Row `row` of a state output of a request of `rows` rows, its
/// `padding` positions along `pad`'s axis dropped from their side (`[1,
/// …, positions − padding, …]`). A request of one row without padding
/// keeps the output as it is (no copy).
pub fn unstack(
    t: &Tensor,
    row: usize,
    rows: usize,
    pad: Option<PadAxis>,
    padding: usize,
) -> Result<Tensor, StateRowsError> {
    if rows == 1 && padding == 0 {
        return Ok(t.clone());
    }
    let shape = t.shape();
    if shape.first() != Some(&rows) {
        return Err(StateRowsError::WrongRows {
            shape: shape.to_vec(),
            rows,
        });
    }
    if row >= rows {
        return Err(StateRowsError::NoSuchRow { rows, row });
    }
    let data: Bytes = t.shared_bytes();
    let Some(pad) = pad.filter(|_| padding > 0) else {
        // One row's contiguous bytes.
        let each = data.len() / rows;
        let mut one = shape.to_vec();
        one[0] = 1;
        return Ok(Tensor::new(
            t.elem(),
            one,
            data.slice(row * each..(row + 1) * each),
        )?);
    };
    let axis = pad.axis;
    let Layout { outer, inner } = layout(t, axis)?;
    let positions = shape[axis];
    let kept = positions
        .checked_sub(padding)
        .ok_or(StateRowsError::Overpadded { padding, positions })?;
    let mut out = BytesMut::with_capacity(outer * kept * inner);
    for o in 0..outer {
        let from = ((row * outer + o) * positions + pad.start(kept, positions)) * inner;
        out.extend_from_slice(&data[from..from + kept * inner]);
    }
    let mut one = shape.to_vec();
    one[0] = 1;
    one[axis] = kept;
    Ok(Tensor::new(t.elem(), one, out.freeze())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEFT: Option<PadAxis> = Some(PadAxis {
        axis: 2,
        right: false,
    });
    const RIGHT: Option<PadAxis> = Some(PadAxis {
        axis: 2,
        right: true,
    });

    /// `[1, heads, positions, 2]` with values that say where they are.
    fn state(heads: usize, positions: usize, tag: f32) -> Tensor {
        let values: Vec<f32> = (0..heads * positions * 2).map(|i| tag + i as f32).collect();
        Tensor::from_values(vec![1, heads, positions, 2], &values).expect("tensor")
    }

    #[test]
    fn rows_pad_on_the_model_s_side_and_cut_back_to_their_own() {
        let (a, b) = (state(3, 2, 100.0), state(3, 4, 200.0));
        let zeros = [0.0; 4];
        let own = [100.0, 101.0, 102.0, 103.0];
        // Row 0, head 0: two padded positions (zeros) before a's own, or after.
        for (pad, first) in [(LEFT, [zeros, own]), (RIGHT, [own, zeros])] {
            let batch = stack(vec![a.clone(), b.clone()], pad, 4).expect("stack");
            assert_eq!(batch.shape(), [2, 3, 4, 2]);
            let v = batch.float_values().expect("floats");
            assert_eq!(&v[..8], first.concat().as_slice());
            // Row 1 is b unchanged.
            assert_eq!(&v[24..], b.float_values().expect("floats").as_slice());
            assert_eq!(unstack(&batch, 0, 2, pad, 2).expect("a"), a);
            assert_eq!(unstack(&batch, 1, 2, pad, 0).expect("b"), b);
        }
        // A right-padded step's output: each row's new position right after its own.
        let grown = stack(vec![state(3, 3, 100.0), state(3, 5, 200.0)], RIGHT, 5).expect("grown");
        assert_eq!(
            unstack(&grown, 0, 2, RIGHT, 2).expect("a"),
            state(3, 3, 100.0)
        );
    }

    #[test]
    fn one_row_without_padding_is_not_copied() {
        let a = state(2, 3, 0.0);
        let same = stack(vec![a.clone()], LEFT, 3).expect("stack");
        assert_eq!(same.bytes().as_ptr(), a.bytes().as_ptr());
        let back = unstack(&same, 0, 1, LEFT, 0).expect("unstack");
        assert_eq!(back.bytes().as_ptr(), a.bytes().as_ptr());
    }

    #[test]
    fn without_an_axis_only_equal_rows_stack() {
        let (a, b) = (state(2, 3, 0.0), state(2, 3, 50.0));
        let batch = stack(vec![a.clone(), b.clone()], None, 3).expect("stack");
        assert_eq!(batch.shape(), [2, 2, 3, 2]);
        assert_eq!(unstack(&batch, 1, 2, None, 0).expect("row"), b);
        let err = stack(vec![a, state(2, 4, 0.0)], None, 4).unwrap_err();
        assert!(matches!(err, StateRowsError::DoNotBatch { .. }), "{err}");
    }

    #[test]
    fn states_that_cannot_batch_are_errors_not_panics() {
        let err = stack(vec![state(2, 5, 0.0)], LEFT, 4).unwrap_err();
        assert_eq!(
            err,
            StateRowsError::TooManyPositions {
                own: 5,
                positions: 4
            }
        );
        assert!(err.to_string().contains("more than the batch's 4"), "{err}");
        let err = stack(vec![state(2, 2, 0.0), state(3, 2, 0.0)], LEFT, 2).unwrap_err();
        assert!(matches!(err, StateRowsError::DoNotBatch { .. }), "{err}");
        let err = unstack(&state(2, 2, 0.0), 3, 1, LEFT, 1).unwrap_err();
        assert_eq!(err, StateRowsError::NoSuchRow { rows: 1, row: 3 });
        let err = unstack(&state(2, 2, 0.0), 0, 2, LEFT, 0).unwrap_err();
        assert!(
            matches!(err, StateRowsError::WrongRows { rows: 2, .. }),
            "{err}"
        );
        let err = unstack(&state(2, 2, 0.0), 0, 1, LEFT, 5).unwrap_err();
        assert_eq!(
            err,
            StateRowsError::Overpadded {
                padding: 5,
                positions: 2
            }
        );
        let err = stack(
            vec![state(2, 2, 0.0), state(2, 2, 0.0)],
            Some(PadAxis {
                axis: 7,
                right: false,
            }),
            2,
        )
        .unwrap_err();
        assert!(
            matches!(err, StateRowsError::NoPositionsAxis { axis: 7, .. }),
            "{err}"
        );
    }
}
