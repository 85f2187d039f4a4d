//! The wire protocol, free of sockets (like `quinn-proto`): what coordinator,
//! workers and clients say to each other over QUIC streams, and how it is
//! framed. The transport reads and writes bytes; everything about their
//! meaning, limits and validation is here, testable without a network.
//!
//! Every stream carries frames. A frame is a 16-byte [`Prefix`] (magic,
//! kind, header length, payload length), a header encoded with bincode
//! (only in [`codec`]), and a raw payload: tensor bytes or a model, never
//! serialized element by element, sent in chunks that are slices of the
//! tensor's shared buffer (no whole copy). Limits ([`Limits`]) are checked
//! from the prefix before anything is allocated; a garbled, oversized or
//! unexpected frame is an error for that stream, never a panic.
//!
//! Layout: [`frame`] (prefix, limits, the incremental [`FrameDecoder`]),
//! [`codec`] (the one bincode module), [`handshake`] (versioned hello),
//! [`message`] (what every channel's messages share), one module per
//! channel — [`client`] (clients ↔ coordinator), [`cluster`] (coordinator
//! ↔ workers), [`data`] (requesters ↔ workers), [`peer`] (workers' data
//! streams) — and the records they carry ([`control`], [`routes`]),
//! [`tensor`] (tensor frames), [`generate`] (text generation), [`embed`]
//! (sentence embeddings), [`shared`]
//! (same-host payloads in shared memory: slices and their allocator). See
//! `docs/protocol.md`.
//!
//! # Example
//!
//! ```
//! use tessera_common::tensor::Tensor;
//! use tessera_common::wire::{peer::PeerMessage, tensor::TensorHeader, Frame, FrameDecoder, Limits};
//!
//! let limits = Limits::default();
//! let t = Tensor::from_values(vec![2, 2], &[1f32, 2.0, 3.0, 4.0])?;
//! let header = TensorHeader::new(7, 42, "x", &t);
//! // What a sender writes: the prefix and header, then the payload chunks.
//! let mut bytes = header.encode(&limits)?;
//! for chunk in tessera_common::wire::chunks(&t.shared_bytes(), 5) {
//!     bytes.extend_from_slice(&chunk);
//! }
//! // A receiver feeds whatever arrives and gets whole frames back.
//! // A worker's data stream: tensor frames, no control messages.
//! let mut decoder = FrameDecoder::<PeerMessage>::new(limits);
//! decoder.push(&bytes[..10])?;
//! assert!(decoder.next_frame()?.is_none());
//! decoder.push(&bytes[10..])?;
//! let Some(Frame::Tensor(h, payload)) = decoder.next_frame()? else { panic!() };
//! assert_eq!(h.into_tensor(payload)?, t);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod client;
pub mod cluster;
pub mod codec;
pub mod control;
pub mod data;
pub mod embed;
pub mod frame;
pub mod generate;
pub mod handshake;
pub mod message;
pub mod peer;
pub mod pieces;
pub mod plan_json;
pub mod routes;
pub mod shared;
pub mod tensor;

pub use frame::{chunks, Frame, FrameDecoder, FrameKind, Limits, Prefix};
pub use message::{Failure, Message, Progress, Reply, Status};

/// The protocol version this build speaks. Peers must match exactly.
/// 13: requests go from requesters to workers (the data channel and
/// routing tables); the coordinator is off the data path. 15: payloads of
/// same-host peers through shared memory (a prefix flag, the hello's
/// region). 16: models by content (a Deploy's pieces, each large weight
/// by its hash; the worker asks for the weights it lacks). 17: a Deploy
/// names where its model was read from (`DeploySpec::source`).
pub const PROTOCOL_VERSION: u16 = 17;

/// Why bytes on a stream were refused. The stream that carried them is
/// closed; the process and its other streams go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("not a Tessera frame (magic {0:02x?})")]
    BadMagic([u8; 2]),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("frame header of {len} bytes exceeds the limit of {max}")]
    HeaderTooLarge { len: u64, max: u64 },
    #[error("frame payload of {len} bytes exceeds the limit of {max}")]
    PayloadTooLarge { len: u64, max: u64 },
    #[error("cannot decode a {what}: {reason}")]
    Decode { what: &'static str, reason: String },
    #[error("cannot encode a {what}: {reason}")]
    Encode { what: &'static str, reason: String },
    #[error("tensor '{name}': {reason}")]
    Tensor { name: String, reason: String },
    #[error("the stream ended inside a frame ({0} bytes left over)")]
    Truncated(usize),
    #[error("out of memory: cannot hold a frame of {0} bytes")]
    OutOfMemory(usize),
    #[error("expected a {expected} frame, got {got}")]
    Unexpected { expected: String, got: String },
}
