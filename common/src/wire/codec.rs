//! The one place that knows headers are bincode (1.3.3, fixed-width little
//! endian integers, trailing bytes refused, decoding bounded by the header
//! limit so a forged length prefix cannot make it allocate).

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::frame::{FrameKind, Limits, Prefix};
use super::WireError;

fn options(limit: u64) -> impl Options {
    bincode::DefaultOptions::new()
        .with_limit(limit)
        .with_little_endian()
        .with_fixint_encoding()
        .reject_trailing_bytes()
}

/// Decodes a header of `what` from exactly `bytes`.
pub fn decode<T: DeserializeOwned>(
    bytes: &[u8],
    what: &'static str,
    limits: &Limits,
) -> Result<T, WireError> {
    options(u64::from(limits.max_header))
        .deserialize(bytes)
        .map_err(|e| WireError::Decode {
            what,
            reason: e.to_string(),
        })
}

/// A frame's prefix and encoded header, for a payload of `payload_len`
/// bytes that the caller sends next.
pub fn encode_frame<T: Serialize>(
    kind: FrameKind,
    header: &T,
    payload_len: u64,
    limits: &Limits,
) -> Result<Vec<u8>, WireError> {
    let what = kind.name();
    let body = options(u64::from(limits.max_header))
        .serialize(header)
        .map_err(|e| WireError::Encode {
            what,
            reason: e.to_string(),
        })?;
    if payload_len > limits.max_payload {
        return Err(WireError::PayloadTooLarge {
            len: payload_len,
            max: limits.max_payload,
        });
    }
    let prefix = Prefix {
        kind,
        // The limit above keeps it far below u32::MAX.
        header_len: u32::try_from(body.len()).map_err(|_| WireError::HeaderTooLarge {
            len: body.len() as u64,
            max: u64::from(limits.max_header),
        })?,
        payload_len,
        shared: false,
    };
    let mut out = Vec::with_capacity(Prefix::LEN + body.len());
    out.extend_from_slice(&prefix.encode());
    out.extend_from_slice(&body);
    Ok(out)
}
