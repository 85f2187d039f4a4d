//! The data channel's worker side: the connections requesters (the SDK,
//! front doors, the coordinator's own front door) and other workers open
//! to this worker's data address. Other workers stream intermediate
//! tensors on unidirectional streams; every peer may open bidirectional
//! streams, one per request (`Open`, then the request's tensors this
//! worker reads, answered by what it has for the request) or per `Cancel`
//! and `EndSequence`. Nothing here reaches the coordinator, and no
//! operation of the coordinator's (deploy, undeploy) is taken here.

use std::sync::Arc;
use std::time::Duration;

use tessera_common::wire::control::{ErrorKind, Transfer};
use tessera_common::wire::data::{DataReply, DataRequest, Open};
use tessera_common::wire::handshake::Role;
use tessera_common::wire::peer::PeerMessage;
use tessera_common::wire::{Frame, Limits};
use tessera_net::shared::Shared;
use tessera_net::{exchange, send_frame_shared, serve_streams, Peer};

use super::requesters::Reply;
use super::routes::Router;
use super::State;

/// Serves one peer's connection until it closes.
pub(super) async fn serve_connection(state: Arc<State>, peer: Peer) {
    let owner: Arc<str> = peer.hello.node.as_str().into();
    let connection = peer.connection;
    let limits = *state.node.limits();
    if peer.hello.role == Role::Worker {
        // Intermediate tensors of requests, from the worker before.
        let handler = super::session::tensor_handler(state.router.clone(), owner.to_string());
        tokio::spawn(serve_streams::<PeerMessage, _, _>(
            connection.clone(),
            limits,
            handler,
        ));
    }
    let shared = tessera_net::shared::of(&connection);
    loop {
        let (send, recv) = match connection.accept_bi().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(peer = %owner, "data connection closed: {e}");
                return;
            }
        };
        let shared = shared.clone();
        tokio::spawn(serve_stream(
            state.clone(),
            owner.clone(),
            shared,
            send,
            recv,
        ));
    }
}

/// One stream: a request, a cancel or the end of a sequence.
async fn serve_stream(
    state: Arc<State>,
    owner: Arc<str>,
    shared: Option<Arc<Shared>>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let limits = *state.node.limits();
    let msg = match exchange::read_operation::<DataRequest>(&mut recv, &limits).await {
        Ok(Some((msg, _))) => msg,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(peer = %owner, "a data stream that is not a request: {e}");
            let _ = recv.stop(1u32.into());
            return;
        }
    };
    let router = &state.router;
    let answer = match msg {
        DataRequest::Open(open) => {
            return open_request(&state, owner, shared, open, send, recv).await
        }
        DataRequest::Cancel { request } => match router.requests.may_cancel(request, &owner) {
            Ok(()) => {
                router.forget(request);
                Ok(())
            }
            Err(refused) => Err(refused),
        },
        DataRequest::EndSequence {
            deployment,
            sequence,
        } => match router.requests.may_end(deployment, sequence, &owner) {
            Ok(()) => {
                router.end_sequence(deployment, sequence);
                Ok(())
            }
            Err(refused) => Err(refused),
        },
    };
    let sent = match answer {
        Ok(()) => exchange::send_message(&mut send, &DataReply::Done, None, &limits).await,
        Err(refused) => {
            tracing::warn!(peer = %owner, "refused: {refused}");
            exchange::send_failure::<DataReply>(
                &mut send,
                ErrorKind::Refused,
                refused.to_string(),
                &limits,
            )
            .await
        }
    };
    if sent.is_ok() {
        let _ = send.finish();
    }
}

/// A request's `Open`: checked, registered, its tensors read and handed
/// to the subgraphs that read them; its replies go back on `send`. Large
/// tensors both ways go through `shared`, the connection's shared memory,
/// where it has some.
async fn open_request(
    state: &Arc<State>,
    owner: Arc<str>,
    shared: Option<Arc<Shared>>,
    open: Open,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
) {
    let limits = *state.node.limits();
    let router = state.router.clone();
    let runs = router.telemetry.subgraphs_of(open.deployment);
    if runs == 0 {
        let error = format!(
            "deployment {} is not on worker {} (re-planned or unloaded)",
            open.deployment, state.name
        );
        return refuse(&mut send, ErrorKind::Unavailable, error, &limits).await;
    }
    if let Some(full) = router
        .telemetry
        .full_mailbox(open.deployment, state.mailbox)
    {
        let busy = DataReply::Busy {
            retry_after_ms: BUSY_RETRY.as_millis() as u64,
            reason: format!("worker {}: {full}", state.name),
        };
        let _ = exchange::send_message(&mut send, &busy, None, &limits).await;
        let _ = send.finish();
        return;
    }
    let replies = match router.requests.open(&open, &owner, runs) {
        Ok(rx) => rx,
        Err(refused) => {
            tracing::warn!(peer = %owner, "refused: {refused}");
            return refuse(&mut send, ErrorKind::Refused, refused.to_string(), &limits).await;
        }
    };
    let replies = write_replies(send, replies, router.clone(), open.request, shared.clone());
    tokio::spawn(replies);
    let stream = Stream {
        recv: &mut recv,
        shared: shared.as_deref(),
    };
    read_inputs(&router, &owner, &open, stream, &limits).await;
}

/// A request stream's receiving side and its connection's shared memory.
struct Stream<'a> {
    recv: &'a mut quinn::RecvStream,
    shared: Option<&'a Shared>,
}

/// Answers a request's stream with a failure and ends it.
async fn refuse(send: &mut quinn::SendStream, kind: ErrorKind, error: String, limits: &Limits) {
    let _ = exchange::send_failure::<DataReply>(send, kind, error, limits).await;
    let _ = send.finish();
}

/// How long a busy worker asks a requester to wait.
const BUSY_RETRY: Duration = Duration::from_millis(5);

/// Reads the `Open`'s tensors and hands them on; a tensor of another
/// request (or deployment) fails the request as refused.
async fn read_inputs(
    router: &Arc<Router>,
    owner: &Arc<str>,
    open: &Open,
    stream: Stream<'_>,
    limits: &Limits,
) {
    let Stream { recv, shared } = stream;
    for _ in 0..open.inputs {
        let (header, payload, took) =
            match tessera_net::recv_frame_shared::<DataRequest>(shared, recv, limits).await {
                Ok(Some((Frame::Tensor(h, p), took))) => (h, p, took),
                Ok(other) => {
                    let what = other.map_or("the end of the stream".to_string(), |(f, _)| {
                        format!("a {} frame", f.kind().name())
                    });
                    let error = format!("request {}: {what} where a tensor was due", open.request);
                    return router.fail_as(open.request, ErrorKind::BadInput, error);
                }
                Err(e) => {
                    let error = format!("request {}: {e}", open.request);
                    return router.fail_as(open.request, ErrorKind::BadInput, error);
                }
            };
        if header.request != open.request || header.network != open.deployment {
            let error = format!(
                "request {}'s stream carried a tensor of request {} of deployment {}",
                open.request, header.request, header.network
            );
            tracing::warn!(peer = %owner, "refused: {error}");
            return router.fail_as(open.request, ErrorKind::Refused, error);
        }
        let name: Arc<str> = header.name.as_str().into();
        let bytes = payload.len() as u64;
        match header.into_tensor(payload) {
            Ok(tensor) => {
                if !name.is_empty() {
                    router.requests.moved(Transfer {
                        request: open.request,
                        tensor: name.to_string(),
                        from: owner.to_string(),
                        to: router.name.clone(),
                        bytes,
                        micros: took.as_micros() as u64,
                    });
                }
                let sequence = open.sequence.as_ref();
                router
                    .dispatch(open.deployment, open.request, sequence, name, tensor)
                    .await;
            }
            Err(e) => {
                let error = format!("request {}: bad tensor: {e}", open.request);
                return router.fail_as(open.request, ErrorKind::BadInput, error);
            }
        }
    }
    // The requester finished its side; anything more is ignored.
    while let Ok(Some(_)) =
        tessera_net::recv_frame_shared::<DataRequest>(shared, recv, limits).await
    {}
}

/// Writes a request's replies on its stream until it has nothing more;
/// a requester that stops reading (it cancelled, or went away) has the
/// request forgotten here.
async fn write_replies(
    mut send: quinn::SendStream,
    mut replies: tokio::sync::mpsc::UnboundedReceiver<Reply>,
    router: Arc<Router>,
    request: u64,
    shared: Option<Arc<Shared>>,
) {
    let stopped = send.stopped();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            reply = replies.recv() => match reply {
                Some(Reply::Frame(head, payload)) => {
                    let payload = payload.as_ref();
                    let sent = send_frame_shared(shared.as_deref(), &mut send, &head, payload);
                    if sent.await.is_err() {
                        break;
                    }
                }
                Some(Reply::End) | None => {
                    let _ = send.finish();
                    return;
                }
            },
            _ = &mut stopped => break,
        }
    }
    tracing::debug!(request, "the requester went away: forgetting the request");
    router.forget(request);
}
