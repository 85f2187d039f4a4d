//! A model encoded as a list of pieces whose concatenation is a valid
//! encoding of it, where every large weight's bytes are its own `raw_data`
//! (a shared slice, not a copy): a subgraph is streamed to its worker
//! straight from the weights the coordinator holds once.
//!
//! Protobuf merges a singular message field that appears several times,
//! appends repeated fields, and takes a message's fields in any order. So
//! the pieces are, first, each large weight wrapped in the fields that hold
//! it with the lengths written by hand (`ModelProto.graph { initializer {
//! <its other fields>, raw_data } }`, or `ModelProto.graph { node { <the
//! Constant node's other fields>, attribute { <...>, t { <...>, raw_data }
//! } } }`), then the model without them. Large initializers decode last
//! among the initializers, large `Constant` nodes first among the nodes
//! (they read nothing: the order stays topological).

use bytes::Bytes;
use prost::Message;

use super::proto::{AttributeProto, ModelProto, NodeProto, TensorProto};

/// Weights with more `raw_data` than this are sent as their own piece.
pub const OWN_PIECE: usize = 64 << 10;

/// Field numbers of onnx.proto, each length-delimited (wire type 2).
const MODEL_GRAPH: u64 = 7;
const GRAPH_NODE: u64 = 1;
const GRAPH_INITIALIZER: u64 = 5;
const NODE_ATTRIBUTE: u64 = 5;
const ATTRIBUTE_T: u64 = 5;
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

fn field_len(field: u64, body: u64) -> u64 {
    prost::encoding::encoded_len_varint(key(field)) as u64
        + prost::encoding::encoded_len_varint(body) as u64
        + body
}

/// Two pieces for `raw` nested in `levels` (outermost first: a field
/// number and the encoding of that message's other fields); `raw` is the
/// innermost message's `raw_data`.
fn nested(levels: &[(u64, Vec<u8>)], raw: Bytes) -> [Bytes; 2] {
    // Body lengths, innermost out.
    let mut bodies = vec![0u64; levels.len()];
    let mut inner = field_len(TENSOR_RAW_DATA, raw.len() as u64);
    for (i, (field, rest)) in levels.iter().enumerate().rev() {
        bodies[i] = rest.len() as u64 + inner;
        inner = field_len(*field, bodies[i]);
    }
    let mut prefix = Vec::with_capacity(levels.iter().map(|(_, r)| r.len() + 16).sum());
    for ((field, rest), body) in levels.iter().zip(&bodies) {
        put_varint(&mut prefix, key(*field));
        put_varint(&mut prefix, *body);
        prefix.extend_from_slice(rest);
    }
    put_varint(&mut prefix, key(TENSOR_RAW_DATA));
    put_varint(&mut prefix, raw.len() as u64);
    [Bytes::from(prefix), raw]
}

fn large(t: &TensorProto) -> bool {
    t.raw_data.as_ref().is_some_and(|r| r.len() > OWN_PIECE)
}

/// The large `value` of an input-less `Constant` node, if it has one.
fn large_value(n: &NodeProto) -> Option<usize> {
    if n.op_type.as_deref() != Some("Constant") || !n.input.is_empty() {
        return None;
    }
    n.attribute
        .iter()
        .position(|a| a.name.as_deref() == Some("value") && a.t.as_ref().is_some_and(large))
}

/// A large initializer as its two pieces.
fn initializer_pieces(mut t: TensorProto) -> [Bytes; 2] {
    let raw = t.raw_data.take().unwrap_or_default();
    nested(
        &[
            (MODEL_GRAPH, Vec::new()),
            (GRAPH_INITIALIZER, t.encode_to_vec()),
        ],
        raw,
    )
}

/// A `Constant` node whose attribute `at` holds a large value, as its two
/// pieces.
fn constant_pieces(mut n: NodeProto, at: usize) -> [Bytes; 2] {
    let mut attr: AttributeProto = n.attribute.remove(at);
    let mut t = attr.t.take().unwrap_or_default();
    let raw = t.raw_data.take().unwrap_or_default();
    nested(
        &[
            (MODEL_GRAPH, Vec::new()),
            (GRAPH_NODE, n.encode_to_vec()),
            (NODE_ATTRIBUTE, attr.encode_to_vec()),
            (ATTRIBUTE_T, t.encode_to_vec()),
        ],
        raw,
    )
}

/// One piece of an encoded model: a frame (field headers, the model
/// without its large weights), or one large weight's `raw_data`, which a
/// worker may already hold by content.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Frame(Bytes),
    Weight(Bytes),
}

impl Part {
    pub fn bytes(&self) -> &Bytes {
        match self {
            Part::Frame(b) | Part::Weight(b) => b,
        }
    }

    pub fn into_bytes(self) -> Bytes {
        match self {
            Part::Frame(b) | Part::Weight(b) => b,
        }
    }
}

/// `model` as pieces (see the module doc): their concatenation decodes to
/// `model` with its large initializers last and its large `Constant`
/// nodes first.
pub fn encode_parts(model: &ModelProto) -> Vec<Bytes> {
    encode_model_parts(model)
        .into_iter()
        .map(Part::into_bytes)
        .collect()
}

/// [`encode_parts`] with each piece marked: every large weight is a
/// [`Part::Weight`], everything else a [`Part::Frame`].
pub fn encode_model_parts(model: &ModelProto) -> Vec<Part> {
    let mut head = model.clone();
    let mut pieces = Vec::new();
    let mut weights = Vec::new();
    if let Some(g) = head.graph.as_mut() {
        let (constants, nodes): (Vec<NodeProto>, Vec<NodeProto>) = std::mem::take(&mut g.node)
            .into_iter()
            .partition(|n| large_value(n).is_some());
        g.node = nodes;
        for n in constants {
            if let Some(at) = large_value(&n) {
                pieces.extend(marked(constant_pieces(n, at)));
            }
        }
        let (large, small): (Vec<TensorProto>, Vec<TensorProto>) =
            std::mem::take(&mut g.initializer)
                .into_iter()
                .partition(large);
        g.initializer = small;
        weights = large;
    }
    pieces.push(Part::Frame(Bytes::from(head.encode_to_vec())));
    for t in weights {
        pieces.extend(marked(initializer_pieces(t)));
    }
    pieces
}

/// A weight's two pieces: its frame, then its bytes.
fn marked([frame, raw]: [Bytes; 2]) -> [Part; 2] {
    [Part::Frame(frame), Part::Weight(raw)]
}

/// Total bytes of `parts`.
pub fn parts_len(parts: &[Bytes]) -> u64 {
    parts.iter().map(|p| p.len() as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::proto::attribute_proto::AttributeType;

    fn concatenated(parts: &[Bytes]) -> ModelProto {
        let mut whole = Vec::new();
        parts.iter().for_each(|p| whole.extend_from_slice(p));
        assert_eq!(whole.len() as u64, parts_len(parts));
        ModelProto::decode(&whole[..]).unwrap()
    }

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
        assert_eq!(concatenated(&parts), shared);
        let marked = encode_model_parts(&shared);
        let weights: Vec<usize> = (0..marked.len())
            .filter(|&i| matches!(marked[i], Part::Weight(_)))
            .collect();
        assert_eq!(weights, vec![2, 4, 6]);
        // A model with only small weights is one piece, its encoding.
        let cnn = crate::synth::small_cnn(1);
        assert_eq!(encode_parts(&cnn), vec![Bytes::from(cnn.encode_to_vec())]);
    }

    #[test]
    fn large_constant_nodes_travel_as_their_own_pieces_first() {
        // The chain with its first weight as a Constant node, after a node.
        let mut model = crate::synth::matmul_chain(2, 256, 5);
        let g = model.graph.as_mut().unwrap();
        let w1 = g.initializer.remove(0);
        let constant = NodeProto {
            name: Some("w1_const".into()),
            op_type: Some("Constant".into()),
            output: vec!["w1".into()],
            attribute: vec![AttributeProto {
                name: Some("value".into()),
                r#type: Some(AttributeType::Tensor as i32),
                t: Some(w1.clone()),
                ..Default::default()
            }],
            ..Default::default()
        };
        g.node.insert(1, constant.clone());
        let parts = encode_parts(&model);
        assert_eq!(parts.len(), 2 + 1 + 2);
        assert_eq!(parts[1].as_ptr(), w1.raw_data.as_ref().unwrap().as_ptr());
        let back = concatenated(&parts);
        let mut want = model.clone();
        let g = want.graph.as_mut().unwrap();
        g.node.remove(1);
        g.node.insert(0, constant);
        assert_eq!(back, want);
    }
}
