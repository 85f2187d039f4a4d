//! What a generative network is fed at each step, found from its graph's
//! inputs: the token ids, and where the model has them the attention mask
//! and the positions (the Hugging Face Optimum / onnxruntime-genai
//! inputs); the state inputs, empty at a fresh step; and the logits it
//! answers with. The coordinator checks a model with it at load, the
//! requester feeds each step with it.

use std::collections::HashMap;

use crate::graph::{Dim, StatePair};
use crate::onnx::ElemType;
use crate::tensor::{Tensor, TensorError};
use crate::wire::routes::Signature;

/// Why a model cannot be fed for generation, or a step's inputs or
/// outputs do not fit it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeedError {
    #[error(
        "the model has no state pairs (outputs present.* fed back as past_key_values.*, \
         or metadata tessera.state_pairs)"
    )]
    NoStatePairs,
    #[error("state input '{0}' has no known rank")]
    StateRank(String),
    #[error(
        "generation feeds {INPUT_IDS}, {ATTENTION_MASK}, {POSITION_IDS} and state \
         inputs; it does not know how to feed '{0}'"
    )]
    UnknownInput(String),
    #[error("the model has no '{INPUT_IDS}' input")]
    NoInputIds,
    #[error("the model has no '{LOGITS}' output")]
    NoLogits,
    #[error("token inputs of type {0} are not supported")]
    TokenType(ElemType),
    #[error("a row past the batch's positions")]
    RowPastBatch,
    #[error("state input '{name}': {source}")]
    EmptyState { name: String, source: TensorError },
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// A state input's type, to make it empty.
struct PastInput {
    name: String,
    elem: ElemType,
    shape: Vec<Dim>,
}

pub struct Feed {
    input_ids: (String, ElemType),
    attention_mask: Option<(String, ElemType)>,
    position_ids: Option<(String, ElemType)>,
    past: Vec<PastInput>,
    /// Every state pair has a positions axis.
    pads_state: bool,
    /// A batch pads each row after its own positions (the model reads
    /// each row's length from the mask), not before them.
    pads_right: bool,
    /// The token ids' first (batch) dimension is not fixed.
    batches: bool,
}

const INPUT_IDS: &str = "input_ids";
const ATTENTION_MASK: &str = "attention_mask";
const POSITION_IDS: &str = "position_ids";
/// The output whose last position the next token is drawn from.
pub const LOGITS: &str = "logits";

impl Feed {
    /// The feed of a network with `signature`, whose state pairs are
    /// `pairs`; an error names an input it would not know how to feed.
    pub fn new(signature: &Signature, pairs: &[StatePair]) -> Result<Feed, FeedError> {
        if pairs.is_empty() {
            return Err(FeedError::NoStatePairs);
        }
        let mut feed = Feed {
            input_ids: (String::new(), ElemType::INT64),
            attention_mask: None,
            position_ids: None,
            past: Vec::new(),
            pads_state: pairs.iter().all(|p| p.axis.is_some()),
            pads_right: pairs.iter().all(|p| p.pads_right),
            batches: false,
        };
        for tensor in &signature.inputs {
            let elem = tensor.elem.map_or(ElemType::INT64, ElemType);
            let name = tensor.name.clone();
            if pairs.iter().any(|p| p.past == name) {
                let shape = tensor
                    .shape
                    .clone()
                    .ok_or_else(|| FeedError::StateRank(name.clone()))?;
                feed.past.push(PastInput { name, elem, shape });
                continue;
            }
            match name.as_str() {
                INPUT_IDS => {
                    let batch = tensor.shape.as_ref().and_then(|s| s.first());
                    feed.batches = batch.is_some_and(|d| d.known().is_none());
                    feed.input_ids = (name, elem);
                }
                ATTENTION_MASK => feed.attention_mask = Some((name, elem)),
                POSITION_IDS => feed.position_ids = Some((name, elem)),
                _ => return Err(FeedError::UnknownInput(name)),
            }
        }
        if feed.input_ids.0.is_empty() {
            return Err(FeedError::NoInputIds);
        }
        if !signature.outputs.iter().any(|t| t.name == LOGITS) {
            return Err(FeedError::NoLogits);
        }
        Ok(feed)
    }

    /// Whether decode steps of several sequences may run as one batch
    /// (the model's batch dimension is not fixed).
    pub fn batches(&self) -> bool {
        self.batches
    }

    /// Whether decode steps of sequences of different lengths may run as
    /// one batch: the model takes an attention mask (which masks each
    /// row's padding) and every state input has a positions axis to pad.
    pub fn pads(&self) -> bool {
        self.batches && self.attention_mask.is_some() && self.pads_state
    }

    /// The inputs of a fresh step over `tokens` (the whole sequence so
    /// far, a prompt or a replay): all of them, and empty state.
    pub fn fresh(&self, tokens: &[u32]) -> Result<HashMap<String, Tensor>, FeedError> {
        let n = tokens.len();
        let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        let mut inputs = HashMap::new();
        inputs.insert(self.input_ids.0.clone(), ints(self.input_ids.1, 1, &ids)?);
        if let Some((name, elem)) = &self.attention_mask {
            inputs.insert(name.clone(), ints(*elem, 1, &vec![1; n])?);
        }
        if let Some((name, elem)) = &self.position_ids {
            let positions: Vec<i64> = (0..n as i64).collect();
            inputs.insert(name.clone(), ints(*elem, 1, &positions)?);
        }
        for past in &self.past {
            inputs.insert(past.name.clone(), empty_state(past)?);
        }
        Ok(inputs)
    }

    /// The inputs of decode steps of several sequences, one row each
    /// (`(token, past)`: the sequence's last token and the positions its
    /// stages keep): the token at its own position, attending to its own
    /// `past` positions and itself, padded to `positions` before them (or
    /// after them where the model pads right: its mask then says each
    /// row's length).
    pub fn decode(
        &self,
        rows: &[(u32, u32)],
        positions: u32,
    ) -> Result<HashMap<String, Tensor>, FeedError> {
        let b = rows.len();
        let ids: Vec<i64> = rows.iter().map(|&(t, _)| i64::from(t)).collect();
        let mut inputs = HashMap::new();
        inputs.insert(self.input_ids.0.clone(), ints(self.input_ids.1, b, &ids)?);
        if let Some((name, elem)) = &self.attention_mask {
            let width = positions as usize + 1;
            let mut mask = Vec::with_capacity(b * width);
            for &(_, past) in rows {
                let padding = positions.checked_sub(past).ok_or(FeedError::RowPastBatch)?;
                // The row's own positions (and its new one), after its padding
                // or before it.
                let start = if self.pads_right { 0 } else { padding as usize };
                let own = start..start + width - padding as usize;
                mask.extend((0..width).map(|i| i64::from(own.contains(&i))));
            }
            inputs.insert(name.clone(), ints(*elem, b, &mask)?);
        }
        if let Some((name, elem)) = &self.position_ids {
            let positions: Vec<i64> = rows.iter().map(|&(_, past)| i64::from(past)).collect();
            inputs.insert(name.clone(), ints(*elem, b, &positions)?);
        }
        Ok(inputs)
    }
}

/// A `[rows, n / rows]` tensor of integers in `elem` (int64 or int32).
fn ints(elem: ElemType, rows: usize, values: &[i64]) -> Result<Tensor, FeedError> {
    let shape = vec![rows, values.len() / rows.max(1)];
    let t = if elem == ElemType::INT32 {
        let narrow: Vec<i32> = values.iter().map(|&v| v as i32).collect();
        Tensor::from_values(shape, &narrow)
    } else if elem == ElemType::INT64 {
        Tensor::from_values(shape, values)
    } else {
        return Err(FeedError::TokenType(elem));
    };
    Ok(t?)
}

/// A state input with no positions yet: batch 1, the growing (symbolic)
/// dimensions 0, the others as declared.
fn empty_state(past: &PastInput) -> Result<Tensor, FeedError> {
    let shape: Vec<usize> = past
        .shape
        .iter()
        .enumerate()
        .map(|(i, d)| match d.known() {
            Some(v) => usize::try_from(v).unwrap_or(0),
            None if i == 0 => 1,
            None => 0,
        })
        .collect();
    Tensor::new(past.elem, shape, bytes::Bytes::new()).map_err(|source| FeedError::EmptyState {
        name: past.name.clone(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::routes::TensorSig;

    fn sig(name: &str, shape: Vec<Dim>) -> TensorSig {
        TensorSig {
            name: name.into(),
            elem: Some(if name == "past" { 1 } else { 7 }),
            shape: Some(shape),
        }
    }

    /// A decoder's signature: ids, mask, positions and one state input
    /// `[batch, 3, positions, 4]`.
    fn feed(pads_right: bool) -> Feed {
        let sym = |s: &str| Dim::Sym(s.into());
        let rows = || vec![sym("batch"), sym("sequence")];
        let signature = Signature {
            inputs: vec![
                sig("input_ids", rows()),
                sig("attention_mask", rows()),
                sig("position_ids", rows()),
                sig(
                    "past",
                    vec![sym("batch"), Dim::Known(3), sym("past"), Dim::Known(4)],
                ),
            ],
            outputs: vec![sig(LOGITS, rows())],
        };
        let pair = StatePair {
            present: "present".into(),
            past: "past".into(),
            axis: Some(2),
            pads_right,
        };
        Feed::new(&signature, &[pair]).expect("feed")
    }

    #[test]
    fn a_batch_s_mask_pads_each_row_on_the_model_s_side() {
        // Rows holding 2 and 4 positions, padded to 4; each step adds one.
        let rows = [(5, 2), (7, 4)];
        let mask = |f: Feed| {
            let inputs = f.decode(&rows, 4).expect("decode");
            inputs[ATTENTION_MASK].int_values().expect("ints")
        };
        let left = [0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
        assert_eq!(mask(feed(false)), left);
        let right = [1, 1, 1, 0, 0, 1, 1, 1, 1, 1];
        assert_eq!(mask(feed(true)), right);
        let inputs = feed(true).decode(&rows, 4).expect("decode");
        assert_eq!(inputs[POSITION_IDS].int_values(), Some(vec![2, 4]));
    }
}
