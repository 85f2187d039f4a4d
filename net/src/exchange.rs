//! Request/reply on one stream, both sides: the asker opens a stream,
//! sends one control message (with its payload), reads `Progress` frames
//! until the answer; the answerer reads that message and writes the answer
//! or a `Failed` with its kind. Every operation between coordinator,
//! workers and clients (load, deploy, query, unload, cluster state) goes
//! through here; requests (`Infer`) add tensor frames on the same stream.

use bytes::Bytes;
use tessera_common::wire::control::{Control, ErrorKind};
use tessera_common::wire::{Frame, Limits};

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
pub async fn request(
    connection: &quinn::Connection,
    msg: &Control,
    payload: Option<&Bytes>,
    limits: &Limits,
    progress: impl FnMut(Control),
) -> Result<Control, ExchangeError> {
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
    connection.open_bi().await.map_err(|e| {
        let why = connection.close_reason().unwrap_or(e);
        NetError::Stream(why.to_string())
    })
}

/// Reads control frames until the answer to a message sent on this stream:
/// `Progress` frames go to `progress`, `Failed` is an error.
pub async fn answer(
    recv: &mut quinn::RecvStream,
    limits: &Limits,
    mut progress: impl FnMut(Control),
) -> Result<Control, ExchangeError> {
    loop {
        match recv_frame(recv, limits).await? {
            Some(Frame::Control(p @ Control::Progress { .. }, _)) => progress(p),
            Some(Frame::Control(Control::Failed { kind, error, .. }, _)) => {
                return Err(ExchangeError::Failed { kind, error })
            }
            Some(Frame::Control(answer, _)) => return Ok(answer),
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
    msg: &Control,
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
    msg: &Control,
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
pub async fn read_operation(
    recv: &mut quinn::RecvStream,
    limits: &Limits,
) -> Result<Option<(Control, Bytes)>, ExchangeError> {
    match recv_frame(recv, limits).await? {
        Some(Frame::Control(msg, payload)) => Ok(Some((msg, payload))),
        Some(other) => Err(ExchangeError::Unexpected(format!(
            "{} frame where an operation was expected",
            other.kind().name()
        ))),
        None => Ok(None),
    }
}

/// Answers an operation with `Failed` (its kind and message).
pub async fn send_failure(
    send: &mut quinn::SendStream,
    request: Option<u64>,
    kind: ErrorKind,
    error: String,
    limits: &Limits,
) -> Result<(), NetError> {
    let msg = Control::Failed {
        request,
        kind,
        error,
    };
    send_message(send, &msg, None, limits).await
}
