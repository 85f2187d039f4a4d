//! Links to other workers, by name, dialled on first use, with the address
//! each was dialled at: a worker that restarted elsewhere is dialled again,
//! not reached through a connection to its old process that nothing closed
//! yet.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_common::wire::handshake::Role;
use tessera_common::wire::Limits;
use tessera_net::{Link, Node};

/// Frames that may wait in one link's queue.
const LINK_DEPTH: usize = 64;

pub struct Peers {
    node: Arc<Node>,
    limits: Limits,
    links: tokio::sync::Mutex<HashMap<String, (String, Link)>>,
}

impl Peers {
    pub fn new(node: Arc<Node>) -> Peers {
        Peers {
            limits: *node.limits(),
            node,
            links: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Drops every link (their connections close).
    pub async fn close(&self) {
        self.links.lock().await.clear();
    }

    /// Ends `network`'s streams on every link (a link busy now keeps them
    /// idle until it goes).
    pub fn forget_network(&self, network: u64) {
        if let Ok(links) = self.links.try_lock() {
            for (_, link) in links.values() {
                link.forget_network(network);
            }
        }
    }

    /// The link to worker `name` at `addr`, dialled on first use (and again
    /// when the worker's address changed or its link closed).
    pub async fn link(&self, name: &str, addr: &str) -> Result<Link, PeerError> {
        let mut links = self.links.lock().await;
        if let Some((_, link)) = links.get(name).filter(|(at, l)| at == addr && l.is_open()) {
            return Ok(link.clone());
        }
        let socket = tessera_net::resolve(addr)
            .await
            .map_err(|source| PeerError::Resolve {
                name: name.to_string(),
                source,
            })?;
        let peer = self
            .node
            .dial(socket)
            .await
            .map_err(|source| PeerError::Unreachable {
                name: name.to_string(),
                source,
            })?;
        // The address must be the worker the route names (its certificate
        // proved the name it answered with).
        if peer.hello.node != name || peer.hello.role != Role::Worker {
            tessera_net::CloseCode::Refused
                .close(&peer.connection, "not the worker the route names");
            return Err(PeerError::NotThatWorker {
                addr: addr.to_string(),
                role: peer.hello.role,
                node: peer.hello.node.clone(),
                name: name.to_string(),
            });
        }
        let link = Link::open(peer.connection, name, self.limits, LINK_DEPTH);
        links.insert(name.to_string(), (addr.to_string(), link.clone()));
        Ok(link)
    }
}

/// Why the link to another worker cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("worker {name}: {source}")]
    Resolve {
        name: String,
        source: tessera_net::NetError,
    },
    #[error("cannot reach worker {name}: {source}")]
    Unreachable {
        name: String,
        source: tessera_net::NetError,
    },
    /// The address answered with another identity (its certificate's).
    #[error("{addr} is the {role} '{node}', not worker {name}")]
    NotThatWorker {
        addr: String,
        role: Role,
        node: String,
        name: String,
    },
}
