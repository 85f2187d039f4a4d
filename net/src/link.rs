//! Data-plane links. A [`Link`] sends frames to one peer: a writer task owns
//! a unidirectional QUIC stream and writes the frames handed to it, in order,
//! payloads as zero-copy chunks (one stream per link rather than one per
//! tensor: fewer stream set-ups, and measured faster).
//!
//! A link has a stream per network and lane, each opened on first use.
//! Everything of a sequence step (a decode step's few kilobytes of
//! tensors) goes on its network's express lane, at a higher QUIC priority,
//! so it never waits behind a large tensor of another request on the same
//! connection; everything else on the network's bulk lane. One network's
//! large tensors, or its full mailboxes at the receiver (which hold back
//! the stream they come on), never hold up another network's. Each stream
//! keeps its own order.
//!
//! [`serve_streams`] reads the frames of every unidirectional stream a peer
//! opens and hands them to a callback. Both use the connection's shared
//! memory where it has some (a peer on the same host: [`crate::shared`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tessera_common::tensor::Tensor;
use tessera_common::wire::generate::Steps;
use tessera_common::wire::tensor::TensorHeader;
use tessera_common::wire::{Frame, Limits, Message};
use tokio::sync::mpsc;

use crate::conn::{recv_frame_shared, send_frame_shared};
use crate::{NetError, StreamError};

/// The express lane's QUIC stream priority (the bulk lane's is 0): the
/// connection sends its data first.
const EXPRESS_PRIORITY: i32 = 1;

/// One frame to write: prefix and header, then the payload.
struct Outgoing {
    head: Vec<u8>,
    payload: Option<Bytes>,
}

/// Which lane of a link a frame takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    Bulk,
    /// A sequence step's frames.
    Express,
}

impl Lane {
    /// The lane of a request's frames: express for sequence steps.
    pub fn of(sequence: Option<&Steps>) -> Lane {
        match sequence {
            Some(_) => Lane::Express,
            None => Lane::Bulk,
        }
    }
}

/// A writer task's queue and why it stopped, once it has.
#[derive(Clone)]
struct Writer {
    tx: mpsc::Sender<Outgoing>,
    failure: Arc<Mutex<Option<WriterFailure>>>,
}

/// Why a writer task stopped: the message, and the connection's close
/// reason where the connection had closed.
#[derive(Clone)]
struct WriterFailure {
    why: String,
    lost: Option<quinn::ConnectionError>,
}

/// A sender of frames to one peer. Cheap to clone.
#[derive(Clone)]
pub struct Link {
    peer: Arc<str>,
    connection: quinn::Connection,
    /// Control messages and network 0's bulk frames: the stream the link
    /// was made with, or its first.
    bulk: Writer,
    /// Each other (network, lane)'s stream, started on first use.
    lanes: Arc<Mutex<HashMap<(u64, Lane), Writer>>>,
    depth: usize,
    limits: Limits,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("peer", &self.peer).finish()
    }
}

impl Link {
    /// Starts the writer task for `connection` (to `peer`, for messages) on
    /// a new unidirectional stream; at most `depth` frames wait in each
    /// lane's queue (senders then wait).
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
        let peer: Arc<str> = peer.into();
        let bulk = Writer::start(connection.clone(), send, peer.clone(), depth, 0);
        Link {
            peer,
            connection,
            bulk,
            lanes: Arc::default(),
            depth,
            limits,
        }
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Whether the writer is still running.
    pub fn is_open(&self) -> bool {
        !self.bulk.tx.is_closed()
    }

    /// The writer of `network`'s `lane`, started on first use.
    fn writer(&self, network: u64, lane: Lane) -> Writer {
        if network == 0 && lane == Lane::Bulk {
            return self.bulk.clone();
        }
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        lanes
            .entry((network, lane))
            .or_insert_with(|| {
                let (connection, peer) = (self.connection.clone(), self.peer.clone());
                let priority = match lane {
                    Lane::Express => EXPRESS_PRIORITY,
                    Lane::Bulk => 0,
                };
                Writer::start(connection, None, peer, self.depth, priority)
            })
            .clone()
    }

    /// Closes `network`'s streams (it was undeployed): what they hold is
    /// still written, then they finish.
    pub fn forget_network(&self, network: u64) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        lanes.retain(|(n, _), _| *n != network);
    }

    /// Queues a frame (`head` from an `encode`) on the link's first stream.
    pub async fn send(&self, head: Vec<u8>, payload: Option<Bytes>) -> Result<(), NetError> {
        self.send_on(0, Lane::Bulk, head, payload).await
    }

    /// Queues a frame on `network`'s `lane`.
    pub async fn send_on(
        &self,
        network: u64,
        lane: Lane,
        head: Vec<u8>,
        payload: Option<Bytes>,
    ) -> Result<(), NetError> {
        let writer = self.writer(network, lane);
        writer
            .tx
            .send(Outgoing { head, payload })
            .await
            .map_err(|_| writer.closed(&self.peer))
    }

    /// Queues a control message without payload on the link's first
    /// stream.
    pub async fn send_control(&self, message: &impl Message) -> Result<(), NetError> {
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

    /// Queues `tensor` as `name` of `request`, `sequence`'s steps, on
    /// `network`'s lane (express for a sequence's steps).
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
        self.send_on(
            network,
            Lane::of(sequence),
            head,
            Some(tensor.shared_bytes()),
        )
        .await
    }
}

impl Writer {
    /// Starts a writer task on `send` or a new unidirectional stream of
    /// `connection` at `priority`.
    fn start(
        connection: quinn::Connection,
        send: Option<quinn::SendStream>,
        peer: Arc<str>,
        depth: usize,
        priority: i32,
    ) -> Writer {
        let (tx, mut rx) = mpsc::channel::<Outgoing>(depth.max(1));
        let failure = Arc::new(Mutex::new(None));
        let writer = Writer {
            tx,
            failure: failure.clone(),
        };
        tokio::spawn(async move {
            let result: Result<(), NetError> = async {
                let mut stream = match send {
                    Some(send) => send,
                    None => connection.open_uni().await?,
                };
                if priority != 0 {
                    let _ = stream.set_priority(priority);
                }
                let shared = crate::shared::of(&connection);
                while let Some(out) = rx.recv().await {
                    let payload = out.payload.as_ref();
                    send_frame_shared(shared.as_deref(), &mut stream, &out.head, payload).await?;
                }
                let _ = stream.finish();
                Ok(())
            }
            .await;
            if let Err(e) = result {
                let lost = connection.close_reason();
                let why = match &lost {
                    Some(reason) => reason.to_string(),
                    None => e.to_string(),
                };
                tracing::warn!(%peer, "link closed: {why}");
                if let Ok(mut slot) = failure.lock() {
                    *slot = Some(WriterFailure { why, lost });
                }
            }
        });
        writer
    }

    fn closed(&self, peer: &Arc<str>) -> NetError {
        let failure = self.failure.lock().ok().and_then(|slot| slot.clone());
        let (why, lost) = match failure {
            Some(WriterFailure { why, lost }) => (why, lost.map(Box::new)),
            None => ("closed".into(), None),
        };
        NetError::Stream(StreamError::Link {
            peer: peer.clone(),
            why,
            lost,
        })
    }
}

/// Reads every unidirectional stream `connection` accepts, each in its own
/// task, handing frames to `on_frame` with the time each took to arrive
/// (first byte to last). A stream that breaks the protocol is
/// stopped and logged; the connection and its other streams go on. Returns
/// when the connection closes, with its reason. Control frames decode as
/// the channel's messages, `M`.
pub async fn serve_streams<M, F, Fut>(
    connection: quinn::Connection,
    limits: Limits,
    on_frame: F,
) -> String
where
    M: Message,
    F: Fn(Frame<M>, std::time::Duration) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let shared = crate::shared::of(&connection);
    loop {
        let mut recv = match connection.accept_uni().await {
            Ok(recv) => recv,
            Err(e) => return e.to_string(),
        };
        let on_frame = on_frame.clone();
        let remote = connection.remote_address();
        let conn = connection.clone();
        let connection_closed = move |_: &quinn::RecvStream| conn.close_reason().is_some();
        let shared = shared.clone();
        tokio::spawn(async move {
            loop {
                match recv_frame_shared(shared.as_deref(), &mut recv, &limits).await {
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
