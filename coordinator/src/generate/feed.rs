//! What a generative network is fed at each step, found from its graph:
//! the token ids, and where the model has them the attention mask and the
//! positions (the Hugging Face Optimum / onnxruntime-genai inputs); the
//! state inputs, empty at a fresh step; and the logits it answers with.

use std::collections::HashMap;

use tessera_common::graph::{Dim, Graph, StatePair};
use tessera_common::onnx::ElemType;
use tessera_common::tensor::Tensor;

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
}

const INPUT_IDS: &str = "input_ids";
const ATTENTION_MASK: &str = "attention_mask";
const POSITION_IDS: &str = "position_ids";
const LOGITS: &str = "logits";

impl Feed {
    /// The feed of `graph`, whose state pairs are `pairs`; an error names
    /// an input it would not know how to feed.
    pub fn new(graph: &Graph, pairs: &[StatePair]) -> Result<Feed, String> {
        if pairs.is_empty() {
            return Err(
                "the model has no state pairs (outputs present.* fed back as past_key_values.*, \
                 or metadata tessera.state_pairs)"
                    .into(),
            );
        }
        let mut feed = Feed {
            input_ids: (String::new(), ElemType::INT64),
            attention_mask: None,
            position_ids: None,
            past: Vec::new(),
        };
        for &t in &graph.inputs {
            let tensor = graph.tensor(t);
            let elem = tensor.elem_type.unwrap_or(ElemType::INT64);
            let name = tensor.name.clone();
            if pairs.iter().any(|p| p.past == name) {
                let shape = tensor
                    .shape
                    .clone()
                    .ok_or_else(|| format!("state input '{name}' has no known rank"))?;
                feed.past.push(PastInput { name, elem, shape });
                continue;
            }
            match name.as_str() {
                INPUT_IDS => feed.input_ids = (name, elem),
                ATTENTION_MASK => feed.attention_mask = Some((name, elem)),
                POSITION_IDS => feed.position_ids = Some((name, elem)),
                _ => {
                    return Err(format!(
                        "generation feeds {INPUT_IDS}, {ATTENTION_MASK}, {POSITION_IDS} and state \
                         inputs; it does not know how to feed '{name}'"
                    ))
                }
            }
        }
        if feed.input_ids.0.is_empty() {
            return Err(format!("the model has no '{INPUT_IDS}' input"));
        }
        if !graph
            .outputs
            .iter()
            .any(|&t| graph.tensor(t).name == LOGITS)
        {
            return Err(format!("the model has no '{LOGITS}' output"));
        }
        Ok(feed)
    }

    /// The inputs of a step over `tokens` (all of the sequence so far): a
    /// fresh step feeds them all and empty state; a later step the last.
    pub fn step(&self, tokens: &[u32], fresh: bool) -> Result<HashMap<String, Tensor>, String> {
        let n = tokens.len();
        let fed: Vec<i64> = if fresh {
            tokens.iter().map(|&t| i64::from(t)).collect()
        } else {
            tokens
                .last()
                .map(|&t| vec![i64::from(t)])
                .unwrap_or_default()
        };
        let first = n - fed.len();
        let mut inputs = HashMap::new();
        inputs.insert(self.input_ids.0.clone(), ints(self.input_ids.1, &fed)?);
        if let Some((name, elem)) = &self.attention_mask {
            inputs.insert(name.clone(), ints(*elem, &vec![1; n])?);
        }
        if let Some((name, elem)) = &self.position_ids {
            let positions: Vec<i64> = (first as i64..n as i64).collect();
            inputs.insert(name.clone(), ints(*elem, &positions)?);
        }
        if fresh {
            for past in &self.past {
                inputs.insert(past.name.clone(), empty_state(past)?);
            }
        }
        Ok(inputs)
    }

    /// The last position's logits of a step's outputs (only that row is
    /// converted: a prefill's logits hold a row per prompt token).
    pub fn last_logits(&self, outputs: &[(String, Tensor)]) -> Result<Vec<f32>, String> {
        let (_, logits) = outputs
            .iter()
            .find(|(n, _)| n == LOGITS)
            .ok_or("the step gave no logits")?;
        let vocab = *logits
            .shape()
            .last()
            .ok_or("the logits have no dimensions")?;
        let row = logits
            .elem()
            .size_bytes()
            .and_then(|b| usize::try_from(b).ok())
            .map(|b| b * vocab)
            .filter(|&row| row > 0 && row <= logits.bytes().len())
            .ok_or_else(|| format!("the logits' shape {:?} holds no row", logits.shape()))?;
        let bytes = logits.shared_bytes();
        let last = Tensor::new(logits.elem(), vec![vocab], bytes.slice(bytes.len() - row..))
            .map_err(|e| e.to_string())?;
        last.float_values()
            .ok_or_else(|| format!("the logits are {}, not floats", logits.elem()))
    }
}

/// A `[1, n]` tensor of integers in `elem` (int64 or int32).
fn ints(elem: ElemType, values: &[i64]) -> Result<Tensor, String> {
    let shape = vec![1, values.len()];
    let t = if elem == ElemType::INT32 {
        let narrow: Vec<i32> = values.iter().map(|&v| v as i32).collect();
        Tensor::from_values(shape, &narrow)
    } else if elem == ElemType::INT64 {
        Tensor::from_values(shape, values)
    } else {
        return Err(format!("token inputs of type {elem} are not supported"));
    };
    t.map_err(|e| e.to_string())
}

/// A state input with no positions yet: batch 1, the growing (symbolic)
/// dimensions 0, the others as declared.
fn empty_state(past: &PastInput) -> Result<Tensor, String> {
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
    Tensor::new(past.elem, shape, bytes::Bytes::new())
        .map_err(|e| format!("state input '{}': {e}", past.name))
}
