//! A model's bones: its encoded bytes with every large weight named by
//! its SHA-256 instead of held. The bones are small (a graph's frames:
//! node and tensor headers and the small weights), and the model is them
//! and its weights, byte for byte: a coordinator that keeps a model's
//! bones in its state store (etcd) and lost the model's bytes takes the
//! weights back from the workers that hold them (they keep weights by the
//! same hash, [`crate::wire::pieces`]) and has the very model it had,
//! checked by its SHA-256.
//!
//! Until then, [`Bones::placeholder`] is the model with zeros in place of
//! its weights, made without touching their pages: its graph, signature
//! and types are the model's, so what the workers still run is adopted
//! and served; nothing must be compiled from it.
//!
//! Pure: the split, the placeholder and the model put back together.

use std::collections::HashMap;
use std::ops::Range;

use bytes::Bytes;

use super::parts::OWN_PIECE;
use super::proto::{ModelProto, TensorProto};
use crate::wire::pieces::{sha256_hex, PieceRef};

/// A model as its frames and its large weights' hashes, in byte order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bones {
    /// The model's bytes in order: each a frame (its bytes in `frames`) or
    /// a large weight (by its SHA-256).
    pub pieces: Vec<PieceRef>,
    /// The frames' bytes, concatenated.
    pub frames: Bytes,
}

/// Why bones cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BonesError {
    #[error("the bones' frames have {got} bytes, their pieces name {want}")]
    Frames { got: u64, want: u64 },
    #[error("the model's {len} bytes are more than this machine can address")]
    TooLarge { len: u64 },
    #[error("{} of the model's weights are not at hand ({bytes} bytes)", hashes.len())]
    Lacking { hashes: Vec<String>, bytes: u64 },
    #[error("weight {sha256} has {got} bytes, its bones name {want}")]
    WeightSize { sha256: String, got: u64, want: u64 },
}

impl Bones {
    /// The bones of `model` (its encoded bytes, `proto` their decoding
    /// with `decode_model_shared`: each weight's bytes are a slice of
    /// `model`), hashing each large weight and calling `hashed` with it
    /// (a caller holding the model mapped gives its pages back). A weight
    /// that is not a slice of `model` stays in the frames.
    pub fn of(model: &Bytes, proto: &ModelProto, mut hashed: impl FnMut(&Bytes)) -> Bones {
        let mut pieces = Vec::new();
        let mut frames = Vec::new();
        let mut at = 0;
        for range in weight_ranges(model, proto) {
            if range.start > at {
                frames.extend_from_slice(&model[at..range.start]);
                pieces.push(PieceRef::Frame {
                    bytes: (range.start - at) as u64,
                });
            }
            let weight = model.slice(range.clone());
            pieces.push(PieceRef::Weight {
                sha256: sha256_hex(&weight),
                bytes: weight.len() as u64,
            });
            hashed(&weight);
            at = range.end;
        }
        if at < model.len() {
            frames.extend_from_slice(&model[at..]);
            pieces.push(PieceRef::Frame {
                bytes: (model.len() - at) as u64,
            });
        }
        Bones {
            pieces,
            frames: frames.into(),
        }
    }

    /// The model's size in bytes.
    pub fn model_len(&self) -> u64 {
        crate::wire::pieces::model_len(&self.pieces)
    }

    /// Its large weights, by hash, with their sizes (in order; a weight
    /// the model holds twice is named once).
    pub fn weights(&self) -> Vec<(&str, u64)> {
        let mut seen = std::collections::HashSet::new();
        self.pieces
            .iter()
            .filter_map(|p| match p {
                PieceRef::Weight { sha256, bytes } => Some((sha256.as_str(), *bytes)),
                PieceRef::Frame { .. } => None,
            })
            .filter(|(sha, _)| seen.insert(*sha))
            .collect()
    }

    /// Checks that the frames are as long as the pieces say.
    pub fn check(&self) -> Result<(), BonesError> {
        let want: u64 = self
            .pieces
            .iter()
            .filter(|p| matches!(p, PieceRef::Frame { .. }))
            .map(PieceRef::bytes)
            .sum();
        let got = self.frames.len() as u64;
        if got != want {
            return Err(BonesError::Frames { got, want });
        }
        usize::try_from(self.model_len()).map_err(|_| BonesError::TooLarge {
            len: self.model_len(),
        })?;
        Ok(())
    }

    /// The model with zeros in place of its large weights. The zeros are
    /// a fresh allocation's untouched pages (not resident until read);
    /// only the frames are written.
    pub fn placeholder(&self) -> Result<Bytes, BonesError> {
        self.check()?;
        let mut model = vec![0u8; self.model_len() as usize];
        let (mut at, mut from) = (0usize, 0usize);
        for piece in &self.pieces {
            let len = piece.bytes() as usize;
            if let PieceRef::Frame { .. } = piece {
                model[at..at + len].copy_from_slice(&self.frames[from..from + len]);
                from += len;
            }
            at += len;
        }
        Ok(model.into())
    }

    /// The model, its weights taken from `weights` (by hash; the caller
    /// checked each against its hash): an error naming those it lacks.
    pub fn model(&self, weights: &HashMap<String, Bytes>) -> Result<Bytes, BonesError> {
        self.check()?;
        let lacking: Vec<(&str, u64)> = self
            .weights()
            .into_iter()
            .filter(|(sha, _)| !weights.contains_key(*sha))
            .collect();
        if !lacking.is_empty() {
            return Err(BonesError::Lacking {
                bytes: lacking.iter().map(|(_, b)| b).sum(),
                hashes: lacking.into_iter().map(|(s, _)| s.to_string()).collect(),
            });
        }
        let mut model = Vec::with_capacity(self.model_len() as usize);
        let mut from = 0usize;
        for piece in &self.pieces {
            match piece {
                PieceRef::Frame { bytes } => {
                    let len = *bytes as usize;
                    model.extend_from_slice(&self.frames[from..from + len]);
                    from += len;
                }
                PieceRef::Weight { sha256, bytes } => {
                    // Present: checked above.
                    let w = weights.get(sha256).map(Bytes::as_ref).unwrap_or_default();
                    if w.len() as u64 != *bytes {
                        return Err(BonesError::WeightSize {
                            sha256: sha256.clone(),
                            got: w.len() as u64,
                            want: *bytes,
                        });
                    }
                    model.extend_from_slice(w);
                }
            }
        }
        Ok(model.into())
    }
}

/// The weights a worker sent back: `held` indexes `asked` (hash and
/// size; ascending), the payload is their bytes in that order. Each is
/// checked against its hash.
pub fn received(
    asked: &[(String, u64)],
    held: &[u32],
    payload: &Bytes,
) -> Result<Vec<(String, Bytes)>, ReceivedError> {
    if let Some(w) = held.windows(2).find(|w| w[1] <= w[0]) {
        return Err(ReceivedError::Unordered(w[1]));
    }
    let mut out = Vec::with_capacity(held.len());
    let mut at = 0usize;
    for &i in held {
        let (sha256, len) = asked.get(i as usize).ok_or(ReceivedError::NotAsked(i))?;
        let end = usize::try_from(*len)
            .ok()
            .and_then(|l| at.checked_add(l))
            .filter(|&end| end <= payload.len())
            .ok_or(ReceivedError::Short {
                got: payload.len() as u64,
            })?;
        let weight = payload.slice(at..end);
        at = end;
        let got = sha256_hex(&weight);
        if got != *sha256 {
            return Err(ReceivedError::Hash {
                got,
                want: sha256.clone(),
            });
        }
        out.push((got, weight));
    }
    if at != payload.len() {
        return Err(ReceivedError::Long {
            extra: (payload.len() - at) as u64,
        });
    }
    Ok(out)
}

/// Why weights a worker sent back are refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReceivedError {
    #[error("weight {0} was not asked for")]
    NotAsked(u32),
    #[error("the weights held are not in ascending order at {0}")]
    Unordered(u32),
    #[error("the weights' payload ended early ({got} bytes)")]
    Short { got: u64 },
    #[error("the weights' payload has {extra} bytes beyond them")]
    Long { extra: u64 },
    #[error("a weight came with sha-256 {got}, {want} was asked for")]
    Hash { got: String, want: String },
}

/// Where each large weight's bytes are in `model`, in order, not
/// overlapping: top-level initializers' and input-less `Constant` nodes'
/// `raw_data` longer than [`OWN_PIECE`] (what a deploy sends as weights).
fn weight_ranges(model: &Bytes, proto: &ModelProto) -> Vec<Range<usize>> {
    let base = model.as_ptr() as usize;
    let within = |raw: &Bytes| {
        let start = (raw.as_ptr() as usize).checked_sub(base)?;
        let end = start.checked_add(raw.len())?;
        (end <= model.len()).then_some(start..end)
    };
    let Some(g) = proto.graph.as_ref() else {
        return Vec::new();
    };
    let constants = g
        .node
        .iter()
        .filter(|n| n.op_type.as_deref() == Some("Constant") && n.input.is_empty())
        .flat_map(|n| &n.attribute)
        .filter_map(|a| a.t.as_ref());
    let mut ranges: Vec<Range<usize>> = g
        .initializer
        .iter()
        .chain(constants)
        .filter_map(|t: &TensorProto| t.raw_data.as_ref())
        .filter(|raw| raw.len() > OWN_PIECE)
        .filter_map(within)
        .collect();
    ranges.sort_by_key(|r| r.start);
    let mut end = 0;
    ranges.retain(|r| {
        let apart = r.start >= end;
        end = end.max(r.end);
        apart
    });
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::{decode_model_shared, encode_model};

    fn chain() -> Bytes {
        Bytes::from(encode_model(&crate::synth::matmul_chain(3, 160, 7)))
    }

    fn bones_of(model: &Bytes) -> Bones {
        let proto = decode_model_shared(model.clone()).unwrap();
        Bones::of(model, &proto, |_| {})
    }

    #[test]
    fn the_model_is_its_bones_and_its_weights_byte_for_byte() {
        let model = chain();
        let mut hashed = 0;
        let proto = decode_model_shared(model.clone()).unwrap();
        let bones = Bones::of(&model, &proto, |_| hashed += 1);
        // Three 160×160 f32 weights (100 KiB each) are named, not kept.
        assert_eq!(bones.weights().len(), 3);
        assert_eq!(hashed, 3);
        assert_eq!(bones.model_len(), model.len() as u64);
        assert!(bones.frames.len() < 4096, "{}", bones.frames.len());
        let weights: HashMap<String, Bytes> = proto
            .graph
            .unwrap()
            .initializer
            .into_iter()
            .filter_map(|t| t.raw_data)
            .map(|b| (sha256_hex(&b), b))
            .collect();
        assert_eq!(bones.model(&weights).unwrap(), model);
    }

    #[test]
    fn a_lacking_weight_is_named_and_the_placeholder_has_the_same_graph() {
        let model = chain();
        let bones = bones_of(&model);
        let Err(BonesError::Lacking { hashes, bytes }) = bones.model(&HashMap::new()) else {
            panic!("lacking weights are an error");
        };
        assert_eq!(hashes.len(), 3);
        assert_eq!(bytes, 3 * 160 * 160 * 4);
        let placeholder = bones.placeholder().unwrap();
        assert_eq!(placeholder.len(), model.len());
        let mut want = decode_model_shared(model).unwrap();
        let got = decode_model_shared(placeholder).unwrap();
        let g = want.graph.as_mut().unwrap();
        for t in &mut g.initializer {
            t.raw_data = t.raw_data.as_ref().map(|b| vec![0u8; b.len()].into());
        }
        assert_eq!(got, want);
    }

    #[test]
    fn weights_sent_back_are_checked_against_what_was_asked() {
        let (w0, w1) = (Bytes::from(vec![1u8; 10]), Bytes::from(vec![2u8; 5]));
        let asked = vec![
            (sha256_hex(&w0), 10),
            ("f".repeat(64), 7),
            (sha256_hex(&w1), 5),
        ];
        let payload: Bytes = [&w0[..], &w1[..]].concat().into();
        let got = received(&asked, &[0, 2], &payload).unwrap();
        assert_eq!(
            got,
            vec![
                (asked[0].0.clone(), w0.clone()),
                (asked[2].0.clone(), w1.clone())
            ]
        );
        assert_eq!(received(&asked, &[], &Bytes::new()).unwrap(), vec![]);
        assert_eq!(
            received(&asked, &[2, 0], &payload),
            Err(ReceivedError::Unordered(0))
        );
        assert_eq!(
            received(&asked, &[0, 3], &payload),
            Err(ReceivedError::NotAsked(3))
        );
        assert!(matches!(
            received(&asked, &[0, 1], &payload),
            Err(ReceivedError::Short { .. }) | Err(ReceivedError::Hash { .. })
        ));
        assert_eq!(
            received(&asked, &[0], &payload),
            Err(ReceivedError::Long { extra: 5 })
        );
        let garbled: Bytes = [&w1[..], &w0[..]].concat().into();
        assert!(matches!(
            received(&asked, &[2, 0], &garbled),
            Err(ReceivedError::Unordered(0))
        ));
        assert!(matches!(
            received(&asked, &[0, 2], &garbled),
            Err(ReceivedError::Hash { .. })
        ));
    }

    #[test]
    fn a_model_without_large_weights_is_all_frames_and_bad_bones_are_refused() {
        let model = Bytes::from(encode_model(&crate::synth::small_cnn(3)));
        let bones = bones_of(&model);
        assert!(bones.weights().is_empty());
        assert_eq!(bones.model(&HashMap::new()).unwrap(), model);
        let short = Bones {
            frames: bones.frames.slice(1..),
            ..bones
        };
        assert!(matches!(short.check(), Err(BonesError::Frames { .. })));
        assert!(short.placeholder().is_err());
    }
}
