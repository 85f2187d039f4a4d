//! A subgraph's model by content. A model is sent in pieces
//! ([`Part`]): frames (field headers, the graph
//! without its large weights) and large weights. A [`DeploySpec`] lists
//! them ([`PieceRef`]), each weight by its SHA-256, so a worker that holds
//! a weight, from any earlier cut of the model or another model that
//! shares it, asks only for the ones it lacks
//! ([`WorkerAnswer::NeedModel`]), and the payload carries the frames and
//! those weights, in order.
//!
//! Pure: the layout and its hash, the check of what a worker asks for, the
//! payload's pieces, and the worker's assembly of the model from what it
//! holds and what it was sent (each received weight checked against its
//! hash before it is kept).
//!
//! [`DeploySpec`]: super::control::DeploySpec
//! [`WorkerAnswer::NeedModel`]: super::cluster::WorkerAnswer::NeedModel

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::onnx::parts::Part;

/// One piece of a subgraph's model, as its Deploy names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PieceRef {
    /// Always sent.
    Frame { bytes: u64 },
    /// A large weight: sent only if the worker lacks it.
    Weight { sha256: String, bytes: u64 },
}

impl PieceRef {
    pub fn bytes(&self) -> u64 {
        match self {
            PieceRef::Frame { bytes } | PieceRef::Weight { bytes, .. } => *bytes,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PieceError {
    #[error("piece {0} is asked for but is not a weight of the model")]
    NotAWeight(u32),
    #[error("the pieces asked for are not in ascending order at {0}")]
    Unordered(u32),
    #[error("the model's payload ended in piece {piece} (it has {got} bytes)")]
    Short { piece: usize, got: u64 },
    #[error("the model's payload has {extra} bytes beyond its pieces")]
    Long { extra: u64 },
    #[error("weight {piece} came with sha-256 {got}, {want} was announced")]
    Hash {
        piece: usize,
        got: String,
        want: String,
    },
    #[error("held weight {piece} has {got} bytes, {want} were announced")]
    HeldSize { piece: usize, got: u64, want: u64 },
    #[error("{held} held weights for {pieces} pieces")]
    HeldCount { held: usize, pieces: usize },
}

/// SHA-256, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The layout of `parts` (each weight hashed) and the model's hash: of
/// its frames and its weights' hashes, in order, so it names the model's
/// content without hashing the weights twice.
pub fn layout(parts: &[Part]) -> (Vec<PieceRef>, String) {
    layout_with(parts, |_| {})
}

/// [`layout`], calling `hashed` with each weight once it is hashed (a
/// caller holding the weights mapped gives their pages back).
pub fn layout_with(parts: &[Part], mut hashed: impl FnMut(&Bytes)) -> (Vec<PieceRef>, String) {
    let mut model = Sha256::new();
    let pieces = parts
        .iter()
        .map(|part| match part {
            Part::Frame(b) => {
                model.update(b"F");
                model.update((b.len() as u64).to_le_bytes());
                model.update(b);
                PieceRef::Frame {
                    bytes: b.len() as u64,
                }
            }
            Part::Weight(b) => {
                let sha256 = sha256_hex(b);
                hashed(b);
                model.update(b"W");
                model.update(sha256.as_bytes());
                PieceRef::Weight {
                    sha256,
                    bytes: b.len() as u64,
                }
            }
        })
        .collect();
    (pieces, hex(&model.finalize()))
}

/// The large weights of a model's `parts` by their SHA-256: what a
/// worker that reads a model from its own disk can take from it.
pub fn weights_by_hash(parts: Vec<Part>) -> std::collections::HashMap<String, Bytes> {
    parts
        .into_iter()
        .filter_map(|part| match part {
            Part::Weight(b) => Some((sha256_hex(&b), b)),
            Part::Frame(_) => None,
        })
        .collect()
}

/// The model's size in bytes.
pub fn model_len(pieces: &[PieceRef]) -> u64 {
    pieces.iter().map(PieceRef::bytes).sum()
}

/// Checks that `missing` names weights of `pieces`, each once, in order.
pub fn check_missing(pieces: &[PieceRef], missing: &[u32]) -> Result<(), PieceError> {
    let mut last = None;
    for &i in missing {
        if last.is_some_and(|l| i <= l) {
            return Err(PieceError::Unordered(i));
        }
        last = Some(i);
        if !matches!(pieces.get(i as usize), Some(PieceRef::Weight { .. })) {
            return Err(PieceError::NotAWeight(i));
        }
    }
    Ok(())
}

/// The pieces a worker that lacks `missing` (checked) is sent: every
/// frame and those weights, in order.
pub fn payload(parts: &[Part], missing: &[u32]) -> Vec<Bytes> {
    parts
        .iter()
        .enumerate()
        .filter(|(i, p)| match p {
            Part::Frame(_) => true,
            Part::Weight(_) => missing.binary_search(&(*i as u32)).is_ok(),
        })
        .map(|(_, p)| p.bytes().clone())
        .collect()
}

/// The payload's size for a worker that lacks `missing`.
pub fn payload_len(pieces: &[PieceRef], missing: &[u32]) -> u64 {
    pieces
        .iter()
        .enumerate()
        .filter(|(i, p)| match p {
            PieceRef::Frame { .. } => true,
            PieceRef::Weight { .. } => missing.binary_search(&(*i as u32)).is_ok(),
        })
        .map(|(_, p)| p.bytes())
        .sum()
}

/// The weights of `pieces` a worker lacks (`held`: per piece, the
/// weight where it holds it), as the indices it asks for.
pub fn missing(pieces: &[PieceRef], held: &[Option<Bytes>]) -> Vec<u32> {
    pieces
        .iter()
        .enumerate()
        .filter(|(i, p)| {
            matches!(p, PieceRef::Weight { .. }) && held.get(*i).is_none_or(Option::is_none)
        })
        .map(|(i, _)| i as u32)
        .collect()
}

/// A model put together from held weights and a payload.
#[derive(Debug)]
pub struct Assembled {
    pub model: Bytes,
    /// The weights the payload brought (hash checked): for the worker to
    /// keep.
    pub received: Vec<(String, Bytes)>,
}

/// The model of `pieces` from `held` (per piece: the weight's bytes where
/// the worker holds it) and `payload` (the frames and the other weights, in
/// order). A payload that brings every weight is the model itself, not a
/// copy.
pub fn assemble(
    pieces: &[PieceRef],
    held: &[Option<Bytes>],
    payload: Bytes,
) -> Result<Assembled, PieceError> {
    if held.len() != pieces.len() {
        return Err(PieceError::HeldCount {
            held: held.len(),
            pieces: pieces.len(),
        });
    }
    let all_sent = held.iter().all(Option::is_none);
    let mut model = Vec::new();
    if !all_sent {
        // What arrived, not what was announced: the model's size when the
        // two agree.
        let held_len: usize = held.iter().flatten().map(Bytes::len).sum();
        model.reserve_exact(held_len + payload.len());
    }
    let mut received = Vec::new();
    let mut at = 0usize;
    for (i, (piece, held)) in pieces.iter().zip(held).enumerate() {
        let want = piece.bytes();
        let bytes = match held {
            Some(b) if b.len() as u64 == want => b.clone(),
            Some(b) => {
                return Err(PieceError::HeldSize {
                    piece: i,
                    got: b.len() as u64,
                    want,
                })
            }
            None => {
                let end = usize::try_from(want)
                    .ok()
                    .and_then(|w| at.checked_add(w))
                    .filter(|&end| end <= payload.len())
                    .ok_or(PieceError::Short {
                        piece: i,
                        got: payload.len() as u64,
                    })?;
                let b = payload.slice(at..end);
                at = end;
                if let PieceRef::Weight { sha256, .. } = piece {
                    let got = sha256_hex(&b);
                    if got != *sha256 {
                        return Err(PieceError::Hash {
                            piece: i,
                            got,
                            want: sha256.clone(),
                        });
                    }
                    received.push((got, b.clone()));
                }
                b
            }
        };
        if !all_sent {
            model.extend_from_slice(&bytes);
        }
    }
    if at != payload.len() {
        return Err(PieceError::Long {
            extra: (payload.len() - at) as u64,
        });
    }
    let model = if all_sent { payload } else { model.into() };
    Ok(Assembled { model, received })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts() -> Vec<Part> {
        vec![
            Part::Frame(Bytes::from_static(b"head")),
            Part::Weight(Bytes::from_static(b"weight-one")),
            Part::Frame(Bytes::from_static(b"mid")),
            Part::Weight(Bytes::from_static(b"weight-two")),
        ]
    }

    fn whole(parts: &[Part]) -> Vec<u8> {
        parts.iter().flat_map(|p| p.bytes().to_vec()).collect()
    }

    #[test]
    fn a_worker_holding_a_weight_is_sent_the_rest_and_assembles_the_model() {
        let parts = parts();
        let (pieces, hash) = layout(&parts);
        assert_eq!(model_len(&pieces), whole(&parts).len() as u64);
        let held = vec![None, Some(Bytes::from_static(b"weight-one")), None, None];
        let lacks = missing(&pieces, &held);
        assert_eq!(lacks, vec![3]);
        check_missing(&pieces, &lacks).unwrap();
        let sent: Vec<u8> = payload(&parts, &lacks).concat();
        assert_eq!(sent, b"headmidweight-two");
        assert_eq!(payload_len(&pieces, &lacks), sent.len() as u64);
        let got = assemble(&pieces, &held, Bytes::from(sent)).unwrap();
        assert_eq!(&got.model[..], &whole(&parts)[..]);
        assert_eq!(got.received.len(), 1);
        assert_eq!(got.received[0].0, sha256_hex(b"weight-two"));
        // The hash names the content: the same pieces, the same hash; a
        // different weight, another.
        assert_eq!(layout(&parts).1, hash);
        let mut other = parts.clone();
        other[3] = Part::Weight(Bytes::from_static(b"weight-2wo"));
        assert_ne!(layout(&other).1, hash);
    }

    #[test]
    fn a_model_read_from_disk_holds_every_weight_by_its_hash() {
        let parts = parts();
        let (pieces, _) = layout(&parts);
        let local = weights_by_hash(parts.clone());
        assert_eq!(local.len(), 2);
        let held: Vec<Option<Bytes>> = pieces
            .iter()
            .map(|p| match p {
                PieceRef::Weight { sha256, .. } => local.get(sha256).cloned(),
                PieceRef::Frame { .. } => None,
            })
            .collect();
        assert!(missing(&pieces, &held).is_empty());
        let frames = payload(&parts, &[]);
        let got = assemble(&pieces, &held, Bytes::from(frames.concat())).unwrap();
        assert_eq!(&got.model[..], &whole(&parts)[..]);
        assert!(got.received.is_empty());
    }

    #[test]
    fn a_payload_of_every_piece_is_the_model_itself() {
        let parts = parts();
        let (pieces, _) = layout(&parts);
        let lacks = missing(&pieces, &[None, None, None, None]);
        assert_eq!(lacks, vec![1, 3]);
        let sent = Bytes::from(payload(&parts, &lacks).concat());
        let got = assemble(&pieces, &[None, None, None, None], sent.clone()).unwrap();
        assert_eq!(got.model.as_ptr(), sent.as_ptr());
        assert_eq!(got.received.len(), 2);
    }

    #[test]
    fn bad_asks_and_garbled_payloads_are_errors() {
        let parts = parts();
        let (pieces, _) = layout(&parts);
        assert_eq!(check_missing(&pieces, &[0]), Err(PieceError::NotAWeight(0)));
        assert_eq!(check_missing(&pieces, &[9]), Err(PieceError::NotAWeight(9)));
        assert_eq!(
            check_missing(&pieces, &[3, 1]),
            Err(PieceError::Unordered(1))
        );
        let none = [None, None, None, None];
        let short = Bytes::from_static(b"headweight-one");
        assert!(matches!(
            assemble(&pieces, &none, short),
            Err(PieceError::Short { piece: 2, .. })
        ));
        let mut long = payload(&parts, &[1, 3]).concat();
        long.push(0);
        assert_eq!(
            assemble(&pieces, &none, long.into()).unwrap_err(),
            PieceError::Long { extra: 1 }
        );
        let garbled = Bytes::from_static(b"headweight-onemidweight-twX");
        assert!(matches!(
            assemble(&pieces, &none, garbled),
            Err(PieceError::Hash { piece: 3, .. })
        ));
        let wrong_held = [None, Some(Bytes::from_static(b"short")), None, None];
        assert!(matches!(
            assemble(&pieces, &wrong_held, Bytes::from_static(b"head")),
            Err(PieceError::HeldSize { piece: 1, .. })
        ));
        assert!(matches!(
            assemble(&pieces, &[None], Bytes::new()),
            Err(PieceError::HeldCount { .. })
        ));
    }
}
