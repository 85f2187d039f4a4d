//! Request/reply on one stream, both sides: the asker opens a stream,
//! sends one operation (with its payload), reads `Progress` until the
//! answer; the answerer reads that operation and writes the answer or a
//! failure with its kind. Every operation between coordinator, workers and
//! clients (load, deploy, query, unload, cluster state) goes through here;
//! requests (`Infer`) add tensor frames on the same stream. Operations and
//! answers are each channel's own messages ([`Message`], [`Reply`]).

use bytes::Bytes;
use tessera_common::wire::control::ErrorKind;
use tessera_common::wire::{Failure, Frame, Limits, Message, Progress, Reply, Status};

use crate::{recv_frame, send_frame, NetError};

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The peer answered `Failed`.
    #[error("{error}")]
    Failed { kind: ErrorKind, error: String },
    /// The connection or stream failed, or a frame broke the protocol.
    #[error(transparent)]
    Net(#[from] NetError),
    /// The peer answered with something else than an answer.
    #[error("unexpected {0}")]
    Unexpected(String),
    /// The peer finished the stream without answering.
    #[error("the stream closed without an answer")]
    NoAnswer,
}

impl ExchangeError {
    /// The failure's kind: the peer's, or [`ErrorKind::Internal`] for the
    /// transport's and protocol's.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ExchangeError::Failed { kind, .. } => *kind,
            _ => ErrorKind::Internal,
        }
    }
}

/// Opens a stream on `connection`, sends `msg` (with `payload`) and
/// returns the answer, handing each `Progress` on the way to `progress`.
/// The stream's failure reads as the connection's close reason where it
/// was closed (a shutdown, a lost peer).
pub async fn request<A: Reply>(
    connection: &quinn::Connection,
    msg: &impl Message,
    payload: Option<&Bytes>,
    limits: &Limits,
    progress: impl FnMut(Progress),
) -> Result<A, ExchangeError> {
    let (mut send, mut recv) = open(connection).await?;
    send_message(&mut send, msg, payload, limits).await?;
    let _ = send.finish();
    answer(&mut recv, limits, progress).await
}

/// A new bidirectional stream on `connection`; its failure reads as the
/// connection's close reason where it was closed.
pub async fn open(
    connection: &quinn::Connection,
) -> Result<(quinn::SendStream, quinn::RecvStream), NetError> {
    connection
        .open_bi()
        .await
        .map_err(|e| connection.close_reason().unwrap_or(e).into())
}

/// Reads control frames until the answer to a message sent on this stream:
/// progress goes to `progress`, a failure is an error.
pub async fn answer<A: Reply>(
    recv: &mut quinn::RecvStream,
    limits: &Limits,
    progress: impl FnMut(Progress),
) -> Result<A, ExchangeError> {
    answer_with_payload(recv, limits, progress)
        .await
        .map(|(answer, _)| answer)
}

/// [`answer`], with the answer's payload (bytes it describes).
pub async fn answer_with_payload<A: Reply>(
    recv: &mut quinn::RecvStream,
    limits: &Limits,
    mut progress: impl FnMut(Progress),
) -> Result<(A, Bytes), ExchangeError> {
    loop {
        match recv_frame::<A>(recv, limits).await? {
            Some(Frame::Control(reply, payload)) => match reply.status() {
                Status::Progress(p) => progress(p),
                Status::Failed(Failure { kind, error, .. }) => {
                    return Err(ExchangeError::Failed { kind, error })
                }
                Status::Answer(answer) => return Ok((answer, payload)),
            },
            Some(other) => {
                return Err(ExchangeError::Unexpected(format!(
                    "{} frame",
                    other.kind().name()
                )))
            }
            None => return Err(ExchangeError::NoAnswer),
        }
    }
}

/// Writes one control message (and its payload) on `send`.
pub async fn send_message(
    send: &mut quinn::SendStream,
    msg: &impl Message,
    payload: Option<&Bytes>,
    limits: &Limits,
) -> Result<(), NetError> {
    let head = msg.encode(payload.map_or(0, |p| p.len() as u64), limits)?;
    send_frame(send, &head, payload).await
}

/// Writes one control message whose payload is the concatenation of
/// `parts` (a model streamed from the weights it shares), calling
/// `progress` with the bytes written so far.
pub async fn send_message_parts(
    send: &mut quinn::SendStream,
    msg: &impl Message,
    parts: &[Bytes],
    limits: &Limits,
    progress: impl FnMut(u64),
) -> Result<(), NetError> {
    let len = parts.iter().map(|p| p.len() as u64).sum();
    let head = msg.encode(len, limits)?;
    crate::send_frame_parts(send, &head, parts, progress).await
}

/// The operation a peer opened a stream with: its message and payload;
/// `None` when it finished the stream without one.
pub async fn read_operation<M: Message>(
    recv: &mut quinn::RecvStream,
    limits: &Limits,
) -> Result<Option<(M, Bytes)>, ExchangeError> {
    match recv_frame(recv, limits).await? {
        Some(Frame::Control(msg, payload)) => Ok(Some((msg, payload))),
        Some(other) => Err(ExchangeError::Unexpected(format!(
            "{} frame where an operation was expected",
            other.kind().name()
        ))),
        None => Ok(None),
    }
}

/// Answers an operation with the channel's failure (its kind and message).
pub async fn send_failure<A: Reply>(
    send: &mut quinn::SendStream,
    kind: ErrorKind,
    error: String,
    limits: &Limits,
) -> Result<(), NetError> {
    let msg = A::failed(Failure::of_operation(kind, error));
    send_message(send, &msg, None, limits).await
}
