//! What every channel's messages share: the [`Message`] trait (a channel's
//! enum, encoded as a control frame's header), the [`Reply`] trait (the
//! side that answers operations: progress, failure or the answer), and the
//! two records several channels carry, [`Progress`] and [`Failure`].
//!
//! Each pair of peers has its own enums, so a `match` on what arrived
//! lists exactly what that channel may carry: [`super::client`] (clients ↔
//! coordinator), [`super::cluster`] (coordinator ↔ workers) and
//! [`super::peer`] (workers' data streams, tensors only).

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::control::ErrorKind;
use super::frame::{FrameKind, Limits};
use super::{codec, WireError};

/// One channel's messages: a control frame's header on that channel.
pub trait Message: Serialize + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static {
    /// What the channel's messages are called in errors.
    const WHAT: &'static str;

    /// The message's name, for errors and logs.
    fn name(&self) -> &'static str;

    /// The frame's prefix and header for a payload of `payload_len` bytes
    /// (0 for messages without one).
    fn encode(&self, payload_len: u64, limits: &Limits) -> Result<Vec<u8>, WireError> {
        codec::encode_frame(FrameKind::Control, self, payload_len, limits)
    }

    /// The whole frame, payload included (for small payloads; large ones
    /// are written after [`Message::encode`] in chunks).
    fn encode_with(&self, payload: &Bytes, limits: &Limits) -> Result<Vec<u8>, WireError> {
        let mut out = self.encode(payload.len() as u64, limits)?;
        out.extend_from_slice(payload);
        Ok(out)
    }
}

/// The messages that answer an operation: besides answers, progress on
/// the way and a failure.
pub trait Reply: Message + Sized {
    /// What the message says about the operation.
    fn status(self) -> Status<Self>;
    /// The message reporting `failure`.
    fn failed(failure: Failure) -> Self;
}

/// A reply, sorted.
#[derive(Debug, Clone, PartialEq)]
pub enum Status<A> {
    /// Long work under way; the answer comes later.
    Progress(Progress),
    /// The operation failed.
    Failed(Failure),
    /// The operation's answer.
    Answer(A),
}

/// Long work under way (compiling, shipping a model): `done` of `total`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    pub what: String,
    pub done: u64,
    pub total: u64,
}

/// Something failed: a request (if given) or the operation its stream
/// carried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub request: Option<u64>,
    pub kind: ErrorKind,
    pub error: String,
}

impl Failure {
    /// The failure of the operation its stream carried.
    pub fn of_operation(kind: ErrorKind, error: impl Into<String>) -> Failure {
        Failure {
            request: None,
            kind,
            error: error.into(),
        }
    }
}

/// Implements [`Message`] for a channel's enum: its name in errors and the
/// name of each variant (the list must name every variant: the `match` it
/// becomes is exhaustive).
macro_rules! channel {
    ($ty:ident, $what:literal, [$($variant:ident),* $(,)?]) => {
        impl $crate::wire::message::Message for $ty {
            const WHAT: &'static str = $what;
            fn name(&self) -> &'static str {
                match self {
                    $($ty::$variant { .. } => stringify!($variant),)*
                }
            }
        }
    };
}
pub(crate) use channel;

/// No control message at all: the channel of a stream that carries none
/// (a handshake's stream, a worker's data streams). A control frame there
/// fails to decode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NoMessage {}

impl Message for NoMessage {
    const WHAT: &'static str = "control message where none is taken";

    fn name(&self) -> &'static str {
        match *self {}
    }
}
