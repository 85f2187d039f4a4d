//! Serving one listener's connections (HTTP, or gRPC, or both on one
//! router): plain TCP or TLS, HTTP/1.1 and HTTP/2 on the same port (ALPN
//! over TLS, the connection preface otherwise), on the coordinator's tokio
//! runtime.
//!
//! Limits against callers that hold resources without using them:
//! - a connection must finish its TLS handshake, and send the first bytes
//!   of a request, within `header_timeout_ms`, and (HTTP/1.1) a whole
//!   request head within that long after it starts one or after its last
//!   answer (slow-loris clients are closed; others are served meanwhile);
//! - at most [`MAX_CONNECTIONS`] connections are open at once (more are
//!   closed as they arrive, and logged);
//! - HTTP/2 connections are pinged every 20 s and closed when a ping goes
//!   unanswered for 20 s;
//! - bodies and messages are bounded by `http_max_body_bytes` where they
//!   are read (HTTP handlers, tonic's decoder).

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

use crate::Door;
use crate::SetupError;

/// The most connections one listener keeps open at once.
pub const MAX_CONNECTIONS: usize = 4096;

/// HTTP/2 keep-alive: a ping this often, the connection closed when one
/// goes unanswered this long.
const H2_PING: Duration = Duration::from_secs(20);

/// The largest HTTP/2 frame this side accepts (h2's default: 16 KB).
const H2_FRAME: u32 = 1 << 20;

/// Binds `addr` now, so that a taken port fails at start.
pub fn bind(what: &'static str, addr: std::net::SocketAddr) -> Result<TcpListener, SetupError> {
    let fail = |source: std::io::Error| SetupError::Listen { what, addr, source };
    let std = std::net::TcpListener::bind(addr).map_err(fail)?;
    std.set_nonblocking(true).map_err(fail)?;
    TcpListener::from_std(std).map_err(fail)
}

/// Serves `router` on `listener` until the coordinator shuts down; open
/// connections then finish the requests under way.
pub async fn serve(door: Arc<Door>, listener: TcpListener, router: axum::Router, what: &str) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = door.closed() => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: pause, go on.
                tracing::warn!("the {what} listener: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "the {what} listener has {MAX_CONNECTIONS} connections open: one more refused");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (door, router) = (door.clone(), router.clone());
        tokio::spawn(async move {
            connection(door, stream, router).await;
            drop(slot);
        });
    }
}

/// One connection: its TLS handshake (when on) and its requests.
async fn connection(door: Arc<Door>, stream: TcpStream, router: axum::Router) {
    let timeout = door.rules.header_timeout;
    match door.rules.tls.clone() {
        Some(tls) => {
            let stream = match tokio::time::timeout(timeout, tls.accept(stream)).await {
                Ok(Ok(s)) => s,
                // Plain HTTP on the TLS port, a bad client hello, or
                // nothing sent: the connection just closes.
                Ok(Err(e)) => return tracing::debug!("TLS handshake refused: {e}"),
                Err(_) => return tracing::debug!("TLS handshake not done in {timeout:?}"),
            };
            requests(&door, stream, router).await;
        }
        None => {
            // Nothing sent at all within the deadline: closed (hyper's
            // own deadline covers a request head once it starts).
            let mut first = [0u8; 1];
            match tokio::time::timeout(timeout, stream.peek(&mut first)).await {
                Ok(Ok(n)) if n > 0 => requests(&door, stream, router).await,
                _ => tracing::debug!("a connection sent nothing in {timeout:?}"),
            }
        }
    }
}

async fn requests<IO>(door: &Door, io: IO, router: axum::Router)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(door.rules.header_timeout);
    // HTTP/2 (gRPC): flow-control windows that grow with the measured
    // bandwidth-delay product (h2's default 64 KB windows took a round
    // trip per 64 KB of a megabyte tensor), and larger frames.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_PING)
        .keep_alive_timeout(H2_PING)
        .adaptive_window(true)
        .max_frame_size(H2_FRAME);
    let service = TowerToHyperService::new(router);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        done = conn.as_mut() => {
            if let Err(e) = done {
                tracing::debug!("a connection ended: {e}");
            }
        }
        () = door.closed() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
        }
    }
}
