//! State pairs: a graph output that feeds a graph input at the next step
//! of the same sequence (a decoder's `present.N.key` becomes its
//! `past_key_values.N.key`). A stage that owns a pair keeps the output per
//! sequence and feeds it back itself, so the state never crosses the
//! network.
//!
//! Pairs come from the model's metadata (`tessera.state_pairs`, a JSON list
//! of `[output, input]`) or, without it, from the names Hugging Face
//! Optimum and onnxruntime-genai use: an output `present<rest>` pairs with
//! the input `past_key_values<rest>` or `past<rest>`.
//!
//! Where a batch of sequences of different lengths pads each row's state
//! is the model's to say (`tessera.padding`): before the row's positions
//! (`left`, the default: every row's new position is the last, its
//! padding masked), or after them (`right`: the model reads each row's
//! length from its attention mask, as onnxruntime's GroupQueryAttention
//! does with `seqlens_k`, and appends at it, so a short row's step does
//! not read the longest row's positions).

use serde::{Deserialize, Serialize};

use super::{Dim, Graph};

/// Metadata key that declares a model's state pairs.
pub const STATE_PAIRS_KEY: &str = "tessera.state_pairs";

/// Metadata key that says where a batch pads each row's state: `left`
/// (the default) or `right`.
pub const PADDING_KEY: &str = "tessera.padding";

/// One output fed back as an input at the next step.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StatePair {
    /// The graph output made at a step (`present.0.key`).
    pub present: String,
    /// The graph input it becomes at the next step (`past_key_values.0.key`).
    pub past: String,
    /// The input's positions axis, the one that grows a position per
    /// token: its only symbolic dimension besides the first (batch).
    /// Where it is known, steps of sequences of different lengths batch
    /// together (each padded to the longest); `None`: they do not.
    #[serde(default)]
    pub axis: Option<u32>,
    /// A batch pads this state after each row's own positions (the
    /// model's `tessera.padding` is `right`), not before them.
    #[serde(default)]
    pub pads_right: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    #[error("metadata {STATE_PAIRS_KEY} is not a JSON list of [output, input] pairs: {0}")]
    BadMetadata(String),
    #[error("metadata {PADDING_KEY} is {0:?}, not \"left\" or \"right\"")]
    BadPadding(String),
    #[error("state pair {present} → {past}: {why}")]
    Mismatch {
        present: String,
        past: String,
        why: String,
    },
}

impl Graph {
    /// The model's state pairs, declared or found by name; each checked:
    /// the output is a graph output and the input a graph input of the same
    /// element type and rank.
    pub fn state_pairs(&self) -> Result<Vec<StatePair>, StateError> {
        let pairs = match self.declared_state_pairs()? {
            Some(pairs) => pairs,
            None => self.state_pairs_by_name(),
        };
        let pads_right = self.pads_right()?;
        let mut pairs = pairs;
        for pair in &mut pairs {
            self.check_state_pair(pair)?;
            pair.axis = self.positions_axis(&pair.past);
            pair.pads_right = pads_right;
        }
        Ok(pairs)
    }

    /// Whether the model's metadata says `tessera.padding` is `right`.
    fn pads_right(&self) -> Result<bool, StateError> {
        let declared = self
            .model()
            .metadata_props
            .iter()
            .find(|e| e.key.as_deref() == Some(PADDING_KEY))
            .map(|e| e.value.as_deref().unwrap_or(""));
        match declared {
            None | Some("left") => Ok(false),
            Some("right") => Ok(true),
            Some(other) => Err(StateError::BadPadding(other.to_string())),
        }
    }

    /// The positions axis of state input `past` (see [`StatePair::axis`]).
    fn positions_axis(&self, past: &str) -> Option<u32> {
        let shape = self.tensor(self.tensor_by_name(past)?).shape.as_ref()?;
        let mut growing = shape
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, d)| d.known().is_none());
        let (axis, _) = growing.next()?;
        match growing.next() {
            Some(_) => None,
            None => u32::try_from(axis).ok(),
        }
    }

    fn declared_state_pairs(&self) -> Result<Option<Vec<StatePair>>, StateError> {
        let Some(entry) = self
            .model()
            .metadata_props
            .iter()
            .find(|e| e.key.as_deref() == Some(STATE_PAIRS_KEY))
        else {
            return Ok(None);
        };
        let text = entry.value.as_deref().unwrap_or("");
        let pairs: Vec<(String, String)> =
            serde_json::from_str(text).map_err(|e| StateError::BadMetadata(e.to_string()))?;
        Ok(Some(
            pairs
                .into_iter()
                .map(|(present, past)| StatePair {
                    present,
                    past,
                    axis: None,
                    pads_right: false,
                })
                .collect(),
        ))
    }

    fn state_pairs_by_name(&self) -> Vec<StatePair> {
        let is_input = |name: &str| {
            self.inputs
                .iter()
                .any(|&t| self.tensor(t).name.as_str() == name)
        };
        self.outputs
            .iter()
            .filter_map(|&t| {
                let present = &self.tensor(t).name;
                let rest = present.strip_prefix("present")?;
                ["past_key_values", "past"]
                    .iter()
                    .map(|prefix| format!("{prefix}{rest}"))
                    .find(|past| is_input(past))
                    .map(|past| StatePair {
                        present: present.clone(),
                        past,
                        axis: None,
                        pads_right: false,
                    })
            })
            .collect()
    }

    fn check_state_pair(&self, pair: &StatePair) -> Result<(), StateError> {
        let mismatch = |why: &str| StateError::Mismatch {
            present: pair.present.clone(),
            past: pair.past.clone(),
            why: why.into(),
        };
        let output = self
            .outputs
            .iter()
            .copied()
            .find(|&t| self.tensor(t).name == pair.present)
            .ok_or_else(|| mismatch("the output is not a graph output"))?;
        let input = self
            .inputs
            .iter()
            .copied()
            .find(|&t| self.tensor(t).name == pair.past)
            .ok_or_else(|| mismatch("the input is not a graph input"))?;
        let (o, i) = (self.tensor(output), self.tensor(input));
        if o.elem_type.is_some() && i.elem_type.is_some() && o.elem_type != i.elem_type {
            return Err(mismatch(&format!(
                "element types differ ({} and {})",
                o.type_string(),
                i.type_string()
            )));
        }
        if let (Some(os), Some(is)) = (&o.shape, &i.shape) {
            if os.len() != is.len() {
                return Err(mismatch(&format!(
                    "ranks differ ({} and {})",
                    o.type_string(),
                    i.type_string()
                )));
            }
        }
        Ok(())
    }

    /// Bytes one sequence's state of `pair` takes per position: the
    /// output's element size times its static dimensions (symbolic ones,
    /// the batch and the growing positions, count as one). `None` where
    /// the type or rank is unknown.
    pub fn state_bytes_per_position(&self, pair: &StatePair) -> Option<u64> {
        let t = self.tensor(self.tensor_by_name(&pair.present)?);
        let elem = t.elem_type?.size_bytes()?;
        t.shape.as_ref()?.iter().try_fold(elem, |acc, d| match d {
            Dim::Known(v) => acc.checked_mul(u64::try_from(*v).ok()?),
            Dim::Sym(_) | Dim::Unknown => Some(acc),
        })
    }
}

impl Graph {
    /// Bytes of state each node keeps (node name → bytes): the maker of
    /// each pair's present output, for `positions` positions in all (the
    /// most sequences a stage keeps × their context).
    pub fn state_need(
        &self,
        pairs: &[StatePair],
        positions: u64,
    ) -> std::collections::BTreeMap<String, u64> {
        let mut need = std::collections::BTreeMap::new();
        for pair in pairs {
            let Some(t) = self.tensor_by_name(&pair.present) else {
                continue;
            };
            let maker = &self.node(self.tensor(t).producer);
            if maker.kind != super::NodeKind::Op {
                continue;
            }
            let bytes = self
                .state_bytes_per_position(pair)
                .unwrap_or(0)
                .saturating_mul(positions);
            let entry: &mut u64 = need.entry(maker.name.clone()).or_default();
            *entry = entry.saturating_add(bytes);
        }
        need
    }
}
