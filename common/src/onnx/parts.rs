//! A model encoded as a list of pieces whose concatenation is a valid
//! encoding of it, where every large initializer's bytes are its own
//! `raw_data` (a shared slice, not a copy): a subgraph is streamed to its
//! worker straight from the weights the coordinator holds once.
//!
//! Protobuf merges a singular message field that appears several times
//! and appends repeated fields, and a message's fields may come in any
//! order; so after the model without its large initializers come, for
//! each of them, `ModelProto.graph { initializer { <its other fields>,
//! raw_data } }`, with the lengths written by hand.

use bytes::Bytes;
use prost::Message;

use super::proto::ModelProto;

/// Initializers with more `raw_data` than this are sent as their own piece.
const OWN_PIECE: usize = 64 << 10;

/// `ModelProto.graph`, `GraphProto.initializer`, `TensorProto.raw_data`:
/// field numbers of onnx.proto, each length-delimited (wire type 2).
const MODEL_GRAPH: u64 = 7;
const GRAPH_INITIALIZER: u64 = 5;
const TENSOR_RAW_DATA: u64 = 9;

fn key(field: u64) -> u64 {
    (field << 3) | 2
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    prost::encoding::encoded_len_varint(v)
}

/// `model` as pieces (see the module doc); their total length and their
/// concatenation decode to `model` with its large initializers last.
pub fn encode_parts(model: &ModelProto) -> Vec<Bytes> {
    let mut head = model.clone();
    let large = match head.graph.as_mut() {
        Some(g) => {
            let (large, small) = std::mem::take(&mut g.initializer)
                .into_iter()
                .partition(|t| t.raw_data.as_ref().is_some_and(|r| r.len() > OWN_PIECE));
            g.initializer = small;
            large
        }
        None => Vec::new(),
    };
    let mut parts = vec![Bytes::from(head.encode_to_vec())];
    for mut t in large {
        let raw = t.raw_data.take().unwrap_or_default();
        let rest = t.encode_to_vec();
        let raw_field = varint_len(key(TENSOR_RAW_DATA)) + varint_len(raw.len() as u64) + raw.len();
        let tensor_len = (rest.len() + raw_field) as u64;
        let graph_len =
            varint_len(key(GRAPH_INITIALIZER)) as u64 + varint_len(tensor_len) as u64 + tensor_len;
        let mut prefix = Vec::with_capacity(rest.len() + 32);
        put_varint(&mut prefix, key(MODEL_GRAPH));
        put_varint(&mut prefix, graph_len);
        put_varint(&mut prefix, key(GRAPH_INITIALIZER));
        put_varint(&mut prefix, tensor_len);
        prefix.extend_from_slice(&rest);
        put_varint(&mut prefix, key(TENSOR_RAW_DATA));
        put_varint(&mut prefix, raw.len() as u64);
        parts.push(Bytes::from(prefix));
        parts.push(raw);
    }
    parts
}

/// Total bytes of `parts`.
pub fn parts_len(parts: &[Bytes]) -> u64 {
    parts.iter().map(|p| p.len() as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_concatenate_to_the_model_sharing_its_weights() {
        // 3 layers of 256×256 f32: 256 KiB each, over the piece threshold.
        let model = crate::synth::matmul_chain(3, 256, 4);
        let shared = super::super::decode_model_shared(Bytes::from(model.encode_to_vec())).unwrap();
        let parts = encode_parts(&shared);
        assert_eq!(parts.len(), 1 + 2 * 3);
        // The weights are the model's own bytes, not copies.
        let w1 = shared.graph.as_ref().unwrap().initializer[0]
            .raw_data
            .clone()
            .unwrap();
        assert_eq!(parts[2].as_ptr(), w1.as_ptr());
        let mut whole = Vec::new();
        parts.iter().for_each(|p| whole.extend_from_slice(p));
        assert_eq!(whole.len() as u64, parts_len(&parts));
        let back = ModelProto::decode(&whole[..]).unwrap();
        assert_eq!(back, shared);
        // A model with only small initializers is one piece, its encoding.
        let cnn = crate::synth::small_cnn(1);
        assert_eq!(encode_parts(&cnn), vec![Bytes::from(cnn.encode_to_vec())]);
    }
}
