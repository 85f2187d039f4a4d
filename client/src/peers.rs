//! A requester's connections to workers' data addresses: dialled on first
//! use with the requester's own cluster certificate, checked to be the
//! worker the routing table names, kept while open (and dialled again when
//! the worker's address changed or the connection closed). Each worker has
//! a cap on this requester's requests in flight there.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tessera_common::wire::handshake::Role;
use tessera_net::{NetError, Node};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};

use crate::ClientError;

/// Requests one requester has in flight at one worker, at most (beyond
/// that, its requests wait for one of them to end).
pub const IN_FLIGHT_PER_WORKER: usize = 64;

/// A connection to one worker.
#[derive(Clone)]
pub struct Worker {
    pub name: Arc<str>,
    pub connection: quinn::Connection,
    slots: Arc<Semaphore>,
    /// Bytes of frames this requester received from workers (shared by
    /// every worker's connection).
    pub received: Arc<AtomicU64>,
}

impl Worker {
    /// Waits for a place among this requester's requests at the worker.
    pub async fn slot(&self) -> Result<OwnedSemaphorePermit, ClientError> {
        self.slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ClientError::Connection("the requester is closing".into()))
    }
}

/// Every worker connection of one requester.
pub struct Peers {
    node: Arc<Node>,
    workers: Mutex<HashMap<String, (String, Worker)>>,
    received: Arc<AtomicU64>,
}

impl Peers {
    pub fn new(node: Arc<Node>) -> Peers {
        Peers {
            node,
            workers: Mutex::new(HashMap::new()),
            received: Arc::default(),
        }
    }

    /// Bytes of frames received from workers so far (outputs, replies).
    pub fn received(&self) -> u64 {
        self.received.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes the connections to workers received so far, their QUIC
    /// datagrams whole (headers, acknowledgements and all).
    pub async fn received_on_the_wire(&self) -> u64 {
        let workers = self.workers.lock().await;
        workers
            .values()
            .map(|(_, w)| w.connection.stats().udp_rx.bytes)
            .sum()
    }

    /// The connection to worker `name` at `addr`.
    pub async fn worker(&self, name: &str, addr: &str) -> Result<Worker, ClientError> {
        {
            let workers = self.workers.lock().await;
            if let Some((_, w)) = workers
                .get(name)
                .filter(|(at, w)| at == addr && w.connection.close_reason().is_none())
            {
                return Ok(w.clone());
            }
        }
        let unreachable = |source: NetError| ClientError::Unreachable {
            worker: name.to_string(),
            source,
        };
        let socket = tessera_net::resolve(addr).await.map_err(unreachable)?;
        let peer = self.node.dial(socket).await.map_err(unreachable)?;
        if peer.hello.node != name || peer.hello.role != Role::Worker {
            tessera_net::CloseCode::Refused
                .close(&peer.connection, "not the worker the routing table names");
            return Err(ClientError::NotTheWorker {
                worker: name.to_string(),
                answer: format!(
                    "{addr} answered as the {} '{}'",
                    peer.hello.role, peer.hello.node
                ),
            });
        }
        let mut workers = self.workers.lock().await;
        // Another request may have dialled it meanwhile: keep one.
        if let Some((_, w)) = workers
            .get(name)
            .filter(|(at, w)| at == addr && w.connection.close_reason().is_none())
        {
            tessera_net::CloseCode::Shutdown.close(&peer.connection, "dialled twice");
            return Ok(w.clone());
        }
        let slots = workers
            .get(name)
            .map(|(_, w)| w.slots.clone())
            .unwrap_or_else(|| Arc::new(Semaphore::new(IN_FLIGHT_PER_WORKER)));
        let worker = Worker {
            name: name.into(),
            connection: peer.connection,
            slots,
            received: self.received.clone(),
        };
        workers.insert(name.to_string(), (addr.to_string(), worker.clone()));
        Ok(worker)
    }
}
