//! Data-plane links. A [`Link`] sends frames to one peer: a writer task owns
//! a unidirectional QUIC stream and writes the frames handed to it, in order,
//! payloads as zero-copy chunks (one stream per link rather than one per
//! tensor: fewer stream set-ups, and measured faster).
//! [`serve_streams`] reads the frames of every unidirectional stream a peer
//! opens and hands them to a callback.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tessera_common::tensor::Tensor;
use tessera_common::wire::generate::Steps;
use tessera_common::wire::tensor::TensorHeader;
use tessera_common::wire::{Frame, Limits};
use tokio::sync::mpsc;

use crate::conn::{recv_frame_timed, send_frame};
use crate::NetError;

/// One frame to write: prefix and header, then the payload.
struct Outgoing {
    head: Vec<u8>,
    payload: Option<Bytes>,
}

/// A sender of frames to one peer. Cheap to clone.
#[derive(Clone)]
pub struct Link {
    peer: Arc<str>,
    tx: mpsc::Sender<Outgoing>,
    /// Why the writer stopped, once it has.
    failure: Arc<Mutex<Option<String>>>,
    limits: Limits,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("peer", &self.peer).finish()
    }
}

impl Link {
    /// Starts the writer task for `connection` (to `peer`, for messages) on
    /// a new unidirectional stream; at most `depth` frames wait in its queue
    /// (senders then wait).
    pub fn open(connection: quinn::Connection, peer: &str, limits: Limits, depth: usize) -> Link {
        Link::start(connection, None, peer, limits, depth)
    }

    /// A link writing on an existing stream (a connection's control stream).
    pub fn on_stream(
        connection: quinn::Connection,
        send: quinn::SendStream,
        peer: &str,
        limits: Limits,
        depth: usize,
    ) -> Link {
        Link::start(connection, Some(send), peer, limits, depth)
    }

    fn start(
        connection: quinn::Connection,
        send: Option<quinn::SendStream>,
        peer: &str,
        limits: Limits,
        depth: usize,
    ) -> Link {
        let (tx, mut rx) = mpsc::channel::<Outgoing>(depth.max(1));
        let failure = Arc::new(Mutex::new(None));
        let link = Link {
            peer: peer.into(),
            tx,
            failure: failure.clone(),
            limits,
        };
        let name = link.peer.clone();
        tokio::spawn(async move {
            let result: Result<(), NetError> = async {
                let mut stream = match send {
                    Some(send) => send,
                    None => connection
                        .open_uni()
                        .await
                        .map_err(|e| NetError::Stream(e.to_string()))?,
                };
                while let Some(out) = rx.recv().await {
                    send_frame(&mut stream, &out.head, out.payload.as_ref()).await?;
                }
                let _ = stream.finish();
                Ok(())
            }
            .await;
            if let Err(e) = result {
                let why = match connection.close_reason() {
                    Some(reason) => reason.to_string(),
                    None => e.to_string(),
                };
                tracing::warn!(peer = %name, "link closed: {why}");
                if let Ok(mut slot) = failure.lock() {
                    *slot = Some(why);
                }
            }
        });
        link
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Whether the writer is still running.
    pub fn is_open(&self) -> bool {
        !self.tx.is_closed()
    }

    fn closed(&self) -> NetError {
        let why = self
            .failure
            .lock()
            .ok()
            .and_then(|slot| slot.clone())
            .unwrap_or_else(|| "closed".into());
        NetError::Stream(format!("link to {}: {why}", self.peer))
    }

    /// Queues a frame (`head` from an `encode`).
    pub async fn send(&self, head: Vec<u8>, payload: Option<Bytes>) -> Result<(), NetError> {
        self.tx
            .send(Outgoing { head, payload })
            .await
            .map_err(|_| self.closed())
    }

    /// Queues a control message without payload.
    pub async fn send_control(
        &self,
        message: &tessera_common::wire::control::Control,
    ) -> Result<(), NetError> {
        self.send(message.encode(0, &self.limits)?, None).await
    }

    /// Queues `tensor` as `name` of `request` (its bytes are not copied).
    pub async fn send_tensor(
        &self,
        network: u64,
        request: u64,
        name: &str,
        tensor: &Tensor,
    ) -> Result<(), NetError> {
        self.send_step_tensor(network, request, None, name, tensor)
            .await
    }

    /// Queues `tensor` as `name` of `request`, `sequence`'s steps.
    pub async fn send_step_tensor(
        &self,
        network: u64,
        request: u64,
        sequence: Option<&Steps>,
        name: &str,
        tensor: &Tensor,
    ) -> Result<(), NetError> {
        let head = TensorHeader::new(network, request, name, tensor)
            .in_sequence(sequence.cloned())
            .encode(&self.limits)?;
        self.send(head, Some(tensor.shared_bytes())).await
    }
}

/// Reads every unidirectional stream `connection` accepts, each in its own
/// task, handing frames to `on_frame` with the time each took to arrive
/// (first byte to last). A stream that breaks the protocol is
/// stopped and logged; the connection and its other streams go on. Returns
/// when the connection closes, with its reason.
pub async fn serve_streams<F, Fut>(
    connection: quinn::Connection,
    limits: Limits,
    on_frame: F,
) -> String
where
    F: Fn(Frame, std::time::Duration) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    loop {
        let mut recv = match connection.accept_uni().await {
            Ok(recv) => recv,
            Err(e) => return e.to_string(),
        };
        let on_frame = on_frame.clone();
        let remote = connection.remote_address();
        let conn = connection.clone();
        let connection_closed = move |_: &quinn::RecvStream| conn.close_reason().is_some();
        tokio::spawn(async move {
            loop {
                match recv_frame_timed(&mut recv, &limits).await {
                    Ok(Some((frame, took))) => on_frame(frame, took).await,
                    Ok(None) => break,
                    Err(e) if connection_closed(&recv) => {
                        tracing::debug!(%remote, "data stream ended with its connection: {e}");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(%remote, "data stream closed: {e}");
                        let _ = recv.stop(2u32.into());
                        break;
                    }
                }
            }
        });
    }
}
