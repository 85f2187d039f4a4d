//! Finding the leading coordinator among several (HA): each listed
//! address is dialled at once and asked `Leader`; the one that leads is
//! used, a standby's answer names the leader (dialled too when not
//! listed), and while none leads (a standby is taking over) the search
//! goes on for up to [`FIND_FOR`].

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tessera_common::wire::client::{ClientReply, ClientRequest};
use tessera_common::wire::handshake::Role;
use tessera_net::{exchange, ExchangeError, Node, Peer};

use crate::ClientError;

/// How long the search for a leader goes on.
pub const FIND_FOR: Duration = Duration::from_secs(15);

/// How long one coordinator may take to answer (a dead one never does).
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// What one coordinator said.
enum Asked {
    Leads(quinn::Connection),
    /// A standby; the leader's address when one leads.
    Standby(Option<String>),
}

/// A connection to the leading coordinator of `addrs`. One address: a
/// failure to reach it is the error, at once; when it stands by, the
/// leader it names is searched for as with several.
pub async fn find(node: &Node, addrs: &[SocketAddr]) -> Result<quinn::Connection, ClientError> {
    if let [one] = addrs {
        let peer = dial(node, *one).await?;
        let asked = tokio::time::timeout(ASK_TIMEOUT, ask_peer(node, *one, peer))
            .await
            .map_err(|_| ClientError::Connection(format!("{one} does not answer")))??;
        return match asked {
            Asked::Leads(connection) => Ok(connection),
            Asked::Standby(leader) => {
                let mut all = vec![*one];
                if let Some(addr) = resolve(leader).await {
                    all.push(addr);
                }
                search(node, &all).await
            }
        };
    }
    search(node, addrs).await
}

async fn resolve(leader: Option<String>) -> Option<SocketAddr> {
    tessera_net::resolve(&leader?).await.ok()
}

/// Asks every address (and the leaders they name) again and again until
/// one leads: each on its own, so a dead one holds up no other.
async fn search(node: &Node, addrs: &[SocketAddr]) -> Result<quinn::Connection, ClientError> {
    let deadline = tokio::time::Instant::now() + FIND_FOR;
    let (named, mut names) = tokio::sync::mpsc::unbounded_channel::<SocketAddr>();
    let mut polled: Vec<SocketAddr> = addrs.to_vec();
    let mut polls: FuturesUnordered<_> = addrs.iter().map(|a| poll(node, *a, &named)).collect();
    loop {
        tokio::select! {
            Some(connection) = polls.next() => return Ok(connection),
            Some(addr) = names.recv() => {
                if !polled.contains(&addr) {
                    polled.push(addr);
                    polls.push(poll(node, addr, &named));
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                return Err(ClientError::Connection(format!(
                    "no coordinator among {} has led for {FIND_FOR:?}",
                    list(addrs)
                )))
            }
        }
    }
}

/// Asks `addr` every 50 ms until it leads: its connection. The leaders
/// a standby names go to `named`.
async fn poll(
    node: &Node,
    addr: SocketAddr,
    named: &tokio::sync::mpsc::UnboundedSender<SocketAddr>,
) -> quinn::Connection {
    loop {
        match ask(node, addr).await {
            Ok(Asked::Leads(connection)) => return connection,
            Ok(Asked::Standby(leader)) => {
                if let Some(leader) = resolve(leader).await {
                    let _ = named.send(leader);
                }
            }
            Err(e) => tracing::debug!("finding the leader: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn list(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

async fn dial(node: &Node, addr: SocketAddr) -> Result<Peer, ClientError> {
    let peer = node.dial(addr).await.map_err(ClientError::Connect)?;
    if peer.hello.role != Role::Coordinator {
        return Err(ClientError::Protocol(format!(
            "{addr} is the {} '{}', not a coordinator",
            peer.hello.role, peer.hello.node
        )));
    }
    Ok(peer)
}

/// Dials `addr` and asks whether it leads.
async fn ask(node: &Node, addr: SocketAddr) -> Result<Asked, ClientError> {
    let asked = async {
        let peer = dial(node, addr).await?;
        ask_peer(node, addr, peer).await
    };
    tokio::time::timeout(ASK_TIMEOUT, asked)
        .await
        .map_err(|_| ClientError::Connection(format!("{addr} does not answer")))?
}

/// Asks coordinator `peer` whether it leads.
async fn ask_peer(node: &Node, addr: SocketAddr, peer: Peer) -> Result<Asked, ClientError> {
    let reply = exchange::request::<ClientReply>(
        &peer.connection,
        &ClientRequest::Leader,
        None,
        node.limits(),
        |_| {},
    )
    .await
    .map_err(|e| match e {
        ExchangeError::Net(e) => ClientError::Transport(e),
        e => ClientError::Connection(e.to_string()),
    })?;
    Ok(match reply {
        ClientReply::Coordinators { leading: true, .. } => Asked::Leads(peer.connection),
        ClientReply::Coordinators { leader, .. } | ClientReply::NotLeader { leader } => {
            peer.connection.close(0u32.into(), b"a standby");
            Asked::Standby(leader)
        }
        other => {
            return Err(ClientError::Protocol(format!(
                "{addr} answered Leader with {other:?}"
            )))
        }
    })
}
