//! Frames: the fixed prefix, the limits checked on it, and an incremental
//! decoder that turns whatever bytes arrive into whole frames.
//!
//! ```text
//! offset 0  2        3       4        8               16
//!        "TS" | kind | flags | header_len u32 LE | payload_len u64 LE
//! then header_len bytes of bincode header, then payload_len raw bytes
//! ```
//!
//! One flag is defined, [`FLAG_SHARED`]: the payload on the stream is a
//! [`SharedSlice`] naming where the real payload lies in the sender's
//! shared memory (peers on the same host, see [`super::shared`]).

use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;

use super::codec;
use super::handshake::Handshake;
use super::message::Message;
use super::shared::{SharedPayloads, SharedSlice};
use super::tensor::TensorHeader;
use super::WireError;

/// The two bytes every frame starts with.
pub const MAGIC: [u8; 2] = *b"TS";

/// The prefix's flag for a payload in shared memory: the stream carries a
/// [`SharedSlice`] in its place.
pub const FLAG_SHARED: u8 = 1;

/// What a frame's header is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A [`Handshake`] message: the first frame each way on a connection.
    Handshake = 1,
    /// A control message of the stream's channel (a [`Message`]); its
    /// payload, if any, is a model or blob the message describes.
    Control = 2,
    /// A [`TensorHeader`]; the payload is the tensor's bytes.
    Tensor = 3,
}

impl FrameKind {
    fn from_u8(v: u8) -> Result<FrameKind, WireError> {
        Ok(match v {
            1 => FrameKind::Handshake,
            2 => FrameKind::Control,
            3 => FrameKind::Tensor,
            other => return Err(WireError::UnknownKind(other)),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            FrameKind::Handshake => "handshake",
            FrameKind::Control => "control",
            FrameKind::Tensor => "tensor",
        }
    }
}

/// Size limits, checked on the prefix before anything is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest encoded header (messages, tensor headers).
    pub max_header: u32,
    /// Largest payload (a tensor or a model).
    pub max_payload: u64,
}

impl Default for Limits {
    /// 1 MiB headers; 4 GiB payloads.
    fn default() -> Limits {
        Limits {
            max_header: 1 << 20,
            max_payload: 4 << 30,
        }
    }
}

/// The fixed 16-byte start of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    pub kind: FrameKind,
    pub header_len: u32,
    pub payload_len: u64,
    /// The payload is a [`SharedSlice`] ([`FLAG_SHARED`]).
    pub shared: bool,
}

impl Prefix {
    pub const LEN: usize = 16;

    pub fn encode(&self) -> [u8; Prefix::LEN] {
        let mut out = [0u8; Prefix::LEN];
        out[..2].copy_from_slice(&MAGIC);
        out[2] = self.kind as u8;
        out[3] = if self.shared { FLAG_SHARED } else { 0 };
        out[4..8].copy_from_slice(&self.header_len.to_le_bytes());
        out[8..].copy_from_slice(&self.payload_len.to_le_bytes());
        out
    }

    /// Parses and checks a prefix against `limits`.
    pub fn decode(bytes: &[u8; Prefix::LEN], limits: &Limits) -> Result<Prefix, WireError> {
        if bytes[..2] != MAGIC {
            return Err(WireError::BadMagic([bytes[0], bytes[1]]));
        }
        let kind = FrameKind::from_u8(bytes[2])?;
        if bytes[3] & !FLAG_SHARED != 0 {
            return Err(WireError::Decode {
                what: "frame prefix",
                reason: format!("unknown flags {:#04x}", bytes[3]),
            });
        }
        let shared = bytes[3] & FLAG_SHARED != 0;
        let header_len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        let mut payload = [0u8; 8];
        payload.copy_from_slice(&bytes[8..]);
        let payload_len = u64::from_le_bytes(payload);
        if header_len > limits.max_header {
            return Err(WireError::HeaderTooLarge {
                len: u64::from(header_len),
                max: u64::from(limits.max_header),
            });
        }
        if payload_len > limits.max_payload {
            return Err(WireError::PayloadTooLarge {
                len: payload_len,
                max: limits.max_payload,
            });
        }
        if shared && (payload_len != SharedSlice::LEN as u64 || kind == FrameKind::Handshake) {
            return Err(WireError::Decode {
                what: "frame prefix",
                reason: format!("a shared {} frame of {payload_len} bytes", kind.name()),
            });
        }
        Ok(Prefix {
            kind,
            header_len,
            payload_len,
            shared,
        })
    }

    /// Turns an encoded frame's start (`head`: prefix and header) into a
    /// shared frame's, whose payload on the stream is `slice`: the
    /// returned bytes are the whole frame to write.
    pub fn shared_frame(head: &[u8], slice: &SharedSlice) -> Result<Vec<u8>, WireError> {
        if head.len() < Prefix::LEN {
            return Err(WireError::Truncated(head.len()));
        }
        let mut frame = Vec::with_capacity(head.len() + SharedSlice::LEN);
        frame.extend_from_slice(head);
        frame[3] |= FLAG_SHARED;
        frame[8..Prefix::LEN].copy_from_slice(&(SharedSlice::LEN as u64).to_le_bytes());
        frame.extend_from_slice(&slice.encode());
        Ok(frame)
    }
}

/// A whole frame, decoded; `M` is the channel's control messages.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame<M> {
    Handshake(Handshake),
    /// A control message and its payload (empty for most messages).
    Control(M, Bytes),
    /// A tensor header and the tensor's bytes (checked against the header
    /// by [`TensorHeader::into_tensor`]).
    Tensor(TensorHeader, Bytes),
}

impl<M> Frame<M> {
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Handshake(_) => FrameKind::Handshake,
            Frame::Control(..) => FrameKind::Control,
            Frame::Tensor(..) => FrameKind::Tensor,
        }
    }
}

/// Zero-copy chunks of `payload` of at most `size` bytes (slices of the
/// same shared buffer), for writers that send large payloads piecewise.
pub fn chunks(payload: &Bytes, size: usize) -> impl Iterator<Item = Bytes> + '_ {
    let size = size.max(1);
    (0..payload.len())
        .step_by(size)
        .map(move |start| payload.slice(start..(start + size).min(payload.len())))
}

/// Turns bytes, as they arrive in any pieces, into whole frames: the one
/// framing code (`tessera-net` reads every stream through it). Nothing is
/// reserved for a frame before its prefix has passed the limits; then at
/// most [`RESERVE_AHEAD`] up front (a peer announcing a large payload must
/// send it before it is held in memory) and, once more arrives, the whole
/// rest at once (growing by doubling would hold up to twice a large
/// model). Memory this process cannot have is an error, not an abort.
/// Control frames decode as the channel's messages, `M`.
pub struct FrameDecoder<M> {
    limits: Limits,
    /// Bytes received and not yet returned in a frame: the current
    /// frame's (its prefix once decoded is dropped), then any that follow.
    buffer: Vec<u8>,
    prefix: Option<Prefix>,
    /// Where shared frames' payloads are read (none: such a frame is an
    /// error).
    shared: Option<Arc<dyn SharedPayloads>>,
    channel: PhantomData<fn() -> M>,
}

impl<M> std::fmt::Debug for FrameDecoder<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameDecoder")
            .field("pending", &self.buffer.len())
            .field("prefix", &self.prefix)
            .field("shared", &self.shared.is_some())
            .finish()
    }
}

/// What a decoder reserves for a frame before its bytes arrive.
pub const RESERVE_AHEAD: usize = 64 << 20;

impl<M: Message> FrameDecoder<M> {
    pub fn new(limits: Limits) -> FrameDecoder<M> {
        FrameDecoder {
            limits,
            buffer: Vec::new(),
            prefix: None,
            shared: None,
            channel: PhantomData,
        }
    }

    /// A decoder that reads shared frames' payloads from `shared`.
    pub fn with_shared(mut self, shared: Option<Arc<dyn SharedPayloads>>) -> FrameDecoder<M> {
        self.shared = shared;
        self
    }

    /// Adds bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        let free = self.buffer.capacity() - self.buffer.len();
        if free < bytes.len() {
            // The rest of the current frame's body at once when it is
            // larger than what arrived; else room for what arrived.
            let more = match self.body_len() {
                Some(body) if body > self.buffer.len() => {
                    (body - self.buffer.len()).max(bytes.len())
                }
                _ => bytes.len(),
            };
            self.reserve(more)?;
        }
        self.buffer.extend_from_slice(bytes);
        Ok(())
    }

    /// Bytes held that do not yet form a whole frame.
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }

    /// Whether a frame's prefix has been decoded and its body is awaited.
    pub fn in_frame(&self) -> bool {
        self.prefix.is_some()
    }

    /// How many more bytes complete the prefix or frame under way: a
    /// reader that reads at most this many never reads past a frame.
    pub fn wanted(&self) -> usize {
        match self.body_len() {
            Some(body) => body.saturating_sub(self.buffer.len()),
            None => Prefix::LEN.saturating_sub(self.buffer.len()),
        }
    }

    /// The current frame's header and payload length, once its prefix is
    /// decoded (`usize::MAX` when it cannot be addressed: the limits
    /// refuse such frames first on any real machine).
    fn body_len(&self) -> Option<usize> {
        self.prefix.map(|p| {
            usize::try_from(u64::from(p.header_len).saturating_add(p.payload_len))
                .unwrap_or(usize::MAX)
        })
    }

    fn reserve(&mut self, more: usize) -> Result<(), WireError> {
        self.buffer
            .try_reserve_exact(more)
            .map_err(|_| WireError::OutOfMemory(self.buffer.len().saturating_add(more)))
    }

    /// The next whole frame, `None` if more bytes are needed. After an
    /// error the stream is unusable (framing is lost).
    pub fn next_frame(&mut self) -> Result<Option<Frame<M>>, WireError> {
        let prefix = match self.prefix {
            Some(p) => p,
            None => {
                if self.buffer.len() < Prefix::LEN {
                    return Ok(None);
                }
                let mut raw = [0u8; Prefix::LEN];
                raw.copy_from_slice(&self.buffer[..Prefix::LEN]);
                let p = Prefix::decode(&raw, &self.limits)?;
                self.buffer.drain(..Prefix::LEN);
                self.prefix = Some(p);
                let body = self.body_len().unwrap_or(usize::MAX);
                let ahead = body.min(RESERVE_AHEAD);
                if ahead > self.buffer.capacity() {
                    self.reserve(ahead - self.buffer.len())?;
                }
                p
            }
        };
        let header_len = prefix.header_len as usize;
        let body = self.body_len().unwrap_or(usize::MAX);
        if self.buffer.len() < body {
            return Ok(None);
        }
        self.prefix = None;
        // The frame's bytes become the payload without a copy; bytes of
        // later frames (a reader that pushed more) move to a new buffer.
        let rest = self.buffer.split_off(body);
        let frame = Bytes::from(std::mem::replace(&mut self.buffer, rest));
        let header = frame.slice(..header_len);
        let mut payload = frame.slice(header_len..);
        if prefix.shared {
            payload = self.take_shared(&payload)?;
        }
        decode_body(prefix.kind, &header, payload, &self.limits).map(Some)
    }

    /// A shared frame's payload, from the peer's region.
    fn take_shared(&self, slice: &[u8]) -> Result<Bytes, WireError> {
        let slice = SharedSlice::decode(slice)?;
        if slice.len > self.limits.max_payload {
            return Err(WireError::PayloadTooLarge {
                len: slice.len,
                max: self.limits.max_payload,
            });
        }
        match &self.shared {
            Some(shared) => shared.take(&slice),
            None => Err(WireError::Unexpected {
                expected: "a payload on the stream".into(),
                got: "one in shared memory, on a stream without it".into(),
            }),
        }
    }

    /// Call when the stream has ended: an error if a frame was cut off.
    pub fn finish(&self) -> Result<(), WireError> {
        match (self.prefix, self.buffer.len()) {
            (None, 0) => Ok(()),
            (_, n) => Err(WireError::Truncated(n)),
        }
    }
}

/// Decodes a frame's header and pairs it with its payload.
pub fn decode_body<M: Message>(
    kind: FrameKind,
    header: &[u8],
    payload: Bytes,
    limits: &Limits,
) -> Result<Frame<M>, WireError> {
    match kind {
        FrameKind::Handshake => {
            if !payload.is_empty() {
                return Err(WireError::Decode {
                    what: "handshake",
                    reason: "a handshake carries no payload".into(),
                });
            }
            Ok(Frame::Handshake(codec::decode(
                header,
                "handshake",
                limits,
            )?))
        }
        FrameKind::Control => {
            let message: M = codec::decode(header, M::WHAT, limits)?;
            Ok(Frame::Control(message, payload))
        }
        FrameKind::Tensor => {
            let header: TensorHeader = codec::decode(header, "tensor header", limits)?;
            header.check_payload(payload.len() as u64)?;
            Ok(Frame::Tensor(header, payload))
        }
    }
}
