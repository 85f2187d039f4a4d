//! The client's connection to the coordinator: dialled to the leader of
//! the coordinators given (HA), dialled again (to the leader) when it
//! closed, and what it shares with every network's requests: the
//! endpoint, the connections to workers, request ids.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tessera_common::wire::handshake::Role;
use tessera_common::wire::Limits;
use tessera_net::certs::NodeIdentity;
use tessera_net::{exchange, Node};

use crate::{infer, leader, peers, ClientError};

/// What every clone of a [`Client`] shares.
pub(crate) struct Inner {
    /// The endpoint: the coordinator's connection and every worker's.
    pub(crate) node: Arc<Node>,
    /// The coordinators' addresses (HA: several, the leader is found
    /// among them), dialled again when the connection closed.
    pub(crate) coordinators: Vec<SocketAddr>,
    pub(crate) connection: Mutex<quinn::Connection>,
    pub(crate) limits: Limits,
    /// The requester's name (its certificate's).
    pub(crate) name: String,
    pub(crate) peers: peers::Peers,
    pub(crate) ids: infer::Ids,
    /// Serialises dialling the coordinator again.
    pub(crate) redial: tokio::sync::Mutex<()>,
}

/// A connection to a cluster: its coordinator (loads, plans, routing
/// tables) and, for requests, its workers. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl Client {
    /// Dials the coordinator at `addr` of cluster `cluster` as a client.
    pub async fn connect(
        addr: SocketAddr,
        identity: &NodeIdentity,
        cluster: &str,
    ) -> Result<Client, ClientError> {
        Client::connect_as(addr, identity, cluster, Role::Client).await
    }

    /// Dials the coordinator with an identity of `role` (a front door on a
    /// worker, or on the coordinator itself, is a requester with its own
    /// certificate).
    pub async fn connect_as(
        addr: SocketAddr,
        identity: &NodeIdentity,
        cluster: &str,
        role: Role,
    ) -> Result<Client, ClientError> {
        Client::connect_any(&[addr], identity, cluster, role).await
    }

    /// Connects to the leading coordinator of `addrs` (HA: every
    /// coordinator; one address works as [`Client::connect_as`]), and
    /// follows the leader from then on.
    pub async fn connect_any(
        addrs: &[SocketAddr],
        identity: &NodeIdentity,
        cluster: &str,
        role: Role,
    ) -> Result<Client, ClientError> {
        let Some(first) = addrs.first() else {
            return Err(ClientError::Connection("no coordinator address".into()));
        };
        let any: SocketAddr = if first.is_ipv6() {
            "[::]:0".parse()
        } else {
            "0.0.0.0:0".parse()
        }
        .map_err(|e: std::net::AddrParseError| ClientError::Connection(e.to_string()))?;
        let node =
            Arc::new(Node::bind(any, identity, cluster, role).map_err(ClientError::Connect)?);
        let connection = leader::find(&node, addrs).await?;
        Ok(Client {
            inner: Arc::new(Inner {
                limits: *node.limits(),
                connection: Mutex::new(connection),
                coordinators: addrs.to_vec(),
                name: identity.name.clone(),
                peers: peers::Peers::new(node.clone()),
                ids: infer::Ids::new(),
                redial: tokio::sync::Mutex::new(()),
                node,
            }),
        })
    }

    /// The coordinator's connection now.
    pub(crate) fn connection(&self) -> quinn::Connection {
        match self.inner.connection.lock() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    pub(crate) fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// The coordinator of the connection stands by (HA): the next
    /// operation finds the leader.
    pub(crate) fn not_leader(&self) {
        self.connection().close(0u32.into(), b"not the leader");
    }

    /// Dials the coordinator (the leader) again if its connection closed.
    pub(crate) async fn reconnect_if_closed(&self) {
        let _one = self.inner.redial.lock().await;
        if self.connection().close_reason().is_none() {
            return;
        }
        match leader::find(&self.inner.node, &self.inner.coordinators).await {
            Ok(connection) => {
                if let Ok(mut c) = self.inner.connection.lock() {
                    *c = connection;
                }
                tracing::info!("connected to the coordinator again");
            }
            Err(e) => tracing::debug!("the coordinator is still away: {e}"),
        }
    }

    /// Bytes of frames this requester received from workers so far, and
    /// what the connections to them received on the wire (QUIC datagrams
    /// whole): what the data path brings back.
    pub async fn data_received(&self) -> (u64, u64) {
        let peers = &self.inner.peers;
        (peers.received(), peers.received_on_the_wire().await)
    }

    /// A stream of its own for one operation.
    pub(crate) async fn open(&self) -> Result<(quinn::SendStream, quinn::RecvStream), ClientError> {
        self.reconnect_if_closed().await;
        exchange::open(&self.connection())
            .await
            .map_err(ClientError::Transport)
    }
}
