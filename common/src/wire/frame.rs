//! Frames: the fixed prefix, the limits checked on it, and an incremental
//! decoder that turns whatever bytes arrive into whole frames.
//!
//! ```text
//! offset 0  2        3       4        8               16
//!        "TS" | kind | flags | header_len u32 LE | payload_len u64 LE
//! then header_len bytes of bincode header, then payload_len raw bytes
//! ```

use bytes::{Buf, Bytes, BytesMut};

use super::codec;
use super::control::Control;
use super::handshake::Handshake;
use super::tensor::TensorHeader;
use super::WireError;

/// The two bytes every frame starts with.
pub const MAGIC: [u8; 2] = *b"TS";

/// What a frame's header is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A [`Handshake`] message: the first frame each way on a connection.
    Handshake = 1,
    /// A [`Control`] message; its payload, if any, is a model or blob the
    /// message describes.
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
}

impl Prefix {
    pub const LEN: usize = 16;

    pub fn encode(&self) -> [u8; Prefix::LEN] {
        let mut out = [0u8; Prefix::LEN];
        out[..2].copy_from_slice(&MAGIC);
        out[2] = self.kind as u8;
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
        Ok(Prefix {
            kind,
            header_len,
            payload_len,
        })
    }
}

/// A whole frame, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Handshake(Handshake),
    /// A control message and its payload (empty for most messages).
    Control(Control, Bytes),
    /// A tensor header and the tensor's bytes (checked against the header
    /// by [`TensorHeader::into_tensor`]).
    Tensor(TensorHeader, Bytes),
}

impl Frame {
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

/// Turns bytes, as they arrive in any pieces, into whole frames. Nothing is
/// reserved for a frame before its prefix has passed the limits.
#[derive(Debug)]
pub struct FrameDecoder {
    limits: Limits,
    buffer: BytesMut,
    prefix: Option<Prefix>,
}

impl FrameDecoder {
    pub fn new(limits: Limits) -> FrameDecoder {
        FrameDecoder {
            limits,
            buffer: BytesMut::new(),
            prefix: None,
        }
    }

    /// Adds bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Bytes held that do not yet form a whole frame.
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }

    /// The next whole frame, `None` if more bytes are needed. After an
    /// error the stream is unusable (framing is lost).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        let prefix = match self.prefix {
            Some(p) => p,
            None => {
                if self.buffer.len() < Prefix::LEN {
                    return Ok(None);
                }
                let mut raw = [0u8; Prefix::LEN];
                raw.copy_from_slice(&self.buffer[..Prefix::LEN]);
                let p = Prefix::decode(&raw, &self.limits)?;
                self.buffer.advance(Prefix::LEN);
                // Room for the body, up to 64 MiB ahead of the data (the
                // buffer grows as more arrives).
                let body = u64::from(p.header_len) + p.payload_len;
                let ahead = usize::try_from(body.min(64 << 20)).unwrap_or(64 << 20);
                self.buffer.reserve(ahead.saturating_sub(self.buffer.len()));
                self.prefix = Some(p);
                p
            }
        };
        let header_len = prefix.header_len as usize;
        let payload_len =
            usize::try_from(prefix.payload_len).map_err(|_| WireError::PayloadTooLarge {
                len: prefix.payload_len,
                max: usize::MAX as u64,
            })?;
        if self.buffer.len() < header_len.saturating_add(payload_len) {
            return Ok(None);
        }
        self.prefix = None;
        let header = self.buffer.split_to(header_len).freeze();
        let payload = self.buffer.split_to(payload_len).freeze();
        decode_body(prefix.kind, &header, payload, &self.limits).map(Some)
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
pub fn decode_body(
    kind: FrameKind,
    header: &[u8],
    payload: Bytes,
    limits: &Limits,
) -> Result<Frame, WireError> {
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
            let message: Control = codec::decode(header, "control message", limits)?;
            Ok(Frame::Control(message, payload))
        }
        FrameKind::Tensor => {
            let header: TensorHeader = codec::decode(header, "tensor header", limits)?;
            header.check_payload(payload.len() as u64)?;
            Ok(Frame::Tensor(header, payload))
        }
    }
}
