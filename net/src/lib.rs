//! `tessera-net`: the transport between coordinator, workers and clients —
//! QUIC (quinn) with mutual TLS (rustls on aws-lc-rs), certificates from a
//! per-cluster CA, and streams that carry `tessera_common::wire` frames.
//! Security is always on: a peer without a certificate from the cluster CA
//! is refused during the TLS handshake, a peer of another protocol version,
//! cluster or role at the Tessera handshake.
//!
//! Layout: [`certs`] (cluster CA, node certificates, `certs init`, throw-away
//! certificates for embedded clusters), [`tls`] (rustls/quinn
//! configurations), [`conn`] (nodes that dial and accept, the handshake,
//! framed streams), [`exchange`] (request/reply on one stream, both
//! sides), [`link`] (data-plane links: a writer task per peer and lane,
//! bulk and express, and the reader of a peer's streams), [`shared`]
//! (payloads through shared memory between peers on the same host).
//!
//! # Example
//!
//! ```
//! use tessera_common::wire::handshake::Role;
//! use tessera_net::{certs, Node};
//!
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let ids = certs::ephemeral("demo", &["coordinator", "node-a"])?;
//! let any = "127.0.0.1:0".parse()?;
//! let coordinator = Node::bind(any, &ids[0], "demo", Role::Coordinator)?;
//! let worker = Node::bind(any, &ids[1], "demo", Role::Worker)?;
//! let addr = coordinator.local_addr()?;
//! let (accepted, dialed) = tokio::join!(coordinator.accept(&[Role::Worker]), worker.dial(addr));
//! assert_eq!(accepted.unwrap()?.hello.node, "node-a");
//! assert_eq!(dialed?.hello.node, "coordinator");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod certs;
pub mod close;
pub mod conn;
pub mod exchange;
pub mod link;
pub mod shared;
pub mod tls;

use std::net::SocketAddr;

pub use close::CloseCode;
pub use conn::{
    recv_frame, recv_frame_shared, recv_frame_timed, send_frame, send_frame_parts,
    send_frame_shared, Node, Peer, HELLO_TIMEOUT,
};
pub use exchange::ExchangeError;
pub use link::{serve_streams, Lane, Link};

/// Resolves `host:port` (a name such as `node-a:7100` on a compose
/// network, or an IP address) to its first socket address.
pub async fn resolve(addr: &str) -> Result<std::net::SocketAddr, NetError> {
    if let Ok(socket) = addr.parse() {
        return Ok(socket);
    }
    let failed = |source: std::io::Error| NetError::Resolve {
        addr: addr.to_string(),
        source,
    };
    tokio::net::lookup_host(addr)
        .await
        .map_err(failed)?
        .next()
        .ok_or_else(|| {
            failed(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no address",
            ))
        })
}
use tessera_common::wire::WireError;

/// Transport errors.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("certificate: {0}")]
    Certificate(String),
    /// A TLS or QUIC configuration was refused (rustls, quinn).
    #[error("TLS configuration: {0}")]
    Tls(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A local I/O operation (`what`: bind an address, read a file) failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The connection could not be made (unreachable, timed out, reset):
    /// trying again later may help.
    #[error("connection with {addr} failed: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    /// The TLS handshake refused a certificate (ours or theirs): trying
    /// again with the same certificates will not help.
    #[error("TLS handshake with {addr} failed: {reason}")]
    TlsRefused { addr: SocketAddr, reason: String },
    #[error("{addr} refused us: {reason}")]
    Refused { addr: SocketAddr, reason: String },
    #[error("refused {addr}: {reason}")]
    Handshake { addr: SocketAddr, reason: String },
    /// A stream or its connection failed: see [`StreamError`] for which.
    #[error("stream: {0}")]
    Stream(#[source] StreamError),
    #[error("cannot resolve '{addr}': {source}")]
    Resolve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Wire(#[from] WireError),
}

/// Why a stream failed: its connection was lost (closed, timed out,
/// reset), or the stream alone was (stopped or reset by the peer), or a
/// link's writer had stopped before.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The connection is gone: no stream on it will work again.
    #[error(transparent)]
    Connection(#[from] quinn::ConnectionError),
    /// Writing failed (the peer stopped the stream, or the connection
    /// was lost: see the error).
    #[error(transparent)]
    Write(#[from] quinn::WriteError),
    /// Reading failed (the peer reset the stream, or the connection was
    /// lost: see the error).
    #[error(transparent)]
    Read(#[from] quinn::ReadError),
    /// A link's writer had stopped: `why` it did; `lost`, the connection's
    /// close reason where the connection had closed.
    #[error("link to {peer}: {why}")]
    Link {
        peer: std::sync::Arc<str>,
        why: String,
        #[source]
        lost: Option<Box<quinn::ConnectionError>>,
    },
}

impl StreamError {
    /// Whether the whole connection is gone (as opposed to one stream).
    pub fn connection_lost(&self) -> bool {
        match self {
            StreamError::Connection(_) => true,
            StreamError::Write(e) => matches!(e, quinn::WriteError::ConnectionLost(_)),
            StreamError::Read(e) => matches!(e, quinn::ReadError::ConnectionLost(_)),
            StreamError::Link { lost, .. } => lost.is_some(),
        }
    }
}

impl From<quinn::ConnectionError> for NetError {
    fn from(e: quinn::ConnectionError) -> NetError {
        NetError::Stream(StreamError::Connection(e))
    }
}

impl From<quinn::WriteError> for NetError {
    fn from(e: quinn::WriteError) -> NetError {
        NetError::Stream(StreamError::Write(e))
    }
}

impl From<quinn::ReadError> for NetError {
    fn from(e: quinn::ReadError) -> NetError {
        NetError::Stream(StreamError::Read(e))
    }
}
