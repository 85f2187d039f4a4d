//! Why a connection is closed: every QUIC application close code Tessera
//! sends, named. The peer sees the code and the reason text (e.g. in
//! `connection lost: closed by peer: refused (code 1)`).

/// A close code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum CloseCode {
    /// The node shuts down.
    Shutdown = 0,
    /// The handshake refused the peer (version, cluster, role, identity).
    Refused = 1,
    /// The coordinator dropped a worker whose session ended.
    Dropped = 3,
    /// The coordinator dropped a worker silent past `worker_timeout_ms`.
    Silent = 4,
    /// The same worker registered again on a new connection.
    RegisteredAgain = 5,
    /// A worker's session with the coordinator ended (it dials again).
    SessionOver = 6,
}

impl CloseCode {
    /// Closes `connection` with this code and `reason`.
    pub fn close(self, connection: &quinn::Connection, reason: &str) {
        connection.close(quinn::VarInt::from_u32(self as u32), reason.as_bytes());
    }

    /// Closes every connection of `endpoint` with this code and `reason`.
    pub fn close_endpoint(self, endpoint: &quinn::Endpoint, reason: &str) {
        endpoint.close(quinn::VarInt::from_u32(self as u32), reason.as_bytes());
    }
}
