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
    let failed = |reason: String| NetError::Resolve {
        addr: addr.to_string(),
        reason,
    };
    tokio::net::lookup_host(addr)
        .await
        .map_err(|e| failed(e.to_string()))?
        .next()
        .ok_or_else(|| failed("no address".into()))
}
use tessera_common::wire::WireError;

/// Transport errors.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("certificate: {0}")]
    Certificate(String),
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("{what}: {reason}")]
    Io { what: String, reason: String },
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
    #[error("stream: {0}")]
    Stream(String),
    #[error("cannot resolve '{addr}': {reason}")]
    Resolve { addr: String, reason: String },
    #[error(transparent)]
    Wire(#[from] WireError),
}
