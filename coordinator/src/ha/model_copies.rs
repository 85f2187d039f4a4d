//! Model bytes between coordinators, so that HA needs no shared volume.
//! Each coordinator keeps the model bytes clients sent in its own
//! `state_dir`. At a load the leader asks every standby to copy them
//! (`CopyModel`) and waits until each has (or could not: then the standby
//! copies them while it stands by, preparing each kept network); a standby
//! copies by asking the leader (`KeptModel`) and checks them against their
//! hash. A takeover then finds them on its own disk.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tessera_common::wire::client::{ClientReply, ClientRequest};
use tessera_common::wire::{Frame, Message};
use tessera_net::exchange;

use crate::{CoordinatorError, Shared};

/// How long the leader waits for a standby's copy of a model.
const COPY_WITHIN: Duration = Duration::from_secs(120);

/// `msg` to the coordinator at `addr`: its reply and payload.
async fn ask(
    shared: &Shared,
    addr: &str,
    msg: &ClientRequest,
) -> Result<(ClientReply, Bytes), String> {
    let socket = tessera_net::resolve(addr)
        .await
        .map_err(|e| e.to_string())?;
    let peer = shared.node.dial(socket).await.map_err(|e| e.to_string())?;
    let limits = *shared.node.limits();
    let asked = async {
        let (mut send, mut recv) = exchange::open(&peer.connection).await?;
        exchange::send_message(&mut send, msg, None, &limits).await?;
        let _ = send.finish();
        tessera_net::recv_frame::<ClientReply>(&mut recv, &limits).await
    };
    let frame = asked.await.map_err(|e| e.to_string());
    peer.connection.close(0u32.into(), b"done");
    match frame? {
        Some(Frame::Control(ClientReply::Failed(f), _)) => Err(f.error),
        Some(Frame::Control(reply, payload)) => Ok((reply, payload)),
        _ => Err(format!("no answer to {}", msg.name())),
    }
}

/// Model bytes by their SHA-256, asked of the coordinator that leads
/// (checked against the hash).
pub async fn from_leader(shared: &Arc<Shared>, sha256: &str) -> Result<Bytes, CoordinatorError> {
    let lacking = |why: String| {
        CoordinatorError::Model(format!("no kept model bytes with sha-256 {sha256}: {why}"))
    };
    let leader = shared.leader.borrow().leader.clone();
    let leader = leader
        .filter(|l| *l != shared.advertised())
        .ok_or_else(|| lacking("no other coordinator leads to ask".into()))?;
    let msg = ClientRequest::KeptModel {
        sha256: sha256.to_string(),
    };
    let bytes = match ask(shared, &leader, &msg).await {
        Ok((ClientReply::KeptModel, bytes)) => bytes,
        Ok((other, _)) => {
            return Err(lacking(format!(
                "the leader {leader} answered {}",
                other.name()
            )))
        }
        Err(e) => return Err(lacking(format!("the leader {leader}: {e}"))),
    };
    let b = bytes.clone();
    let got = tokio::task::spawn_blocking(move || crate::state::sha256_hex(&b))
        .await
        .unwrap_or_default();
    if got != sha256 {
        return Err(lacking(format!("the leader sent bytes with sha-256 {got}")));
    }
    tracing::info!(
        sha256,
        bytes = bytes.len(),
        leader,
        "model bytes from the leader"
    );
    Ok(bytes)
}

/// The leader, after a load (of model bytes a client sent, or a named
/// model's file, which a standby's host may lack): every standby copies
/// them now (each at once; warned, not failed, where one cannot).
pub async fn to_standbys(shared: &Arc<Shared>, sha256: &str) {
    if shared.ha.is_none() {
        return;
    }
    let me = shared.advertised();
    let standbys: Vec<String> = crate::ha::coordinators(shared)
        .await
        .into_iter()
        .filter(|c| !c.leading && c.addr != me)
        .map(|c| c.addr)
        .collect();
    let msg = ClientRequest::CopyModel {
        sha256: sha256.to_string(),
    };
    let copies = standbys.iter().map(|addr| {
        let msg = &msg;
        async move {
            let asked = tokio::time::timeout(COPY_WITHIN, ask(shared, addr, msg)).await;
            match asked {
                Ok(Ok((ClientReply::Copied, _))) => {
                    tracing::info!(standby = %addr, sha256, "the standby keeps the model")
                }
                Ok(Ok((other, _))) => {
                    tracing::warn!(standby = %addr, "copying a model: it answered {}", other.name())
                }
                Ok(Err(e)) => tracing::warn!(standby = %addr, "copying a model: {e}"),
                Err(_) => tracing::warn!(standby = %addr, "copying a model: no answer within {COPY_WITHIN:?}"),
            }
        }
    });
    futures_util::future::join_all(copies).await;
}

/// `KeptModel`: the model bytes this coordinator holds (a loaded
/// network's, the state store's or the models cache's: [`crate::known`])
/// as the payload.
pub async fn send_kept(
    shared: &Arc<Shared>,
    sha256: String,
    send: &mut quinn::SendStream,
) -> Result<(), CoordinatorError> {
    let bytes = crate::known::find(shared, &sha256).await.ok_or_else(|| {
        CoordinatorError::Model(format!("no model bytes with sha-256 {sha256} here"))
    })?;
    let limits = *shared.node.limits();
    let payload = [bytes];
    exchange::send_message_parts(send, &ClientReply::KeptModel, &payload, &limits, |_| {}).await?;
    Ok(())
}

/// `CopyModel`: keeps the model bytes (from this coordinator's store, else
/// the leader's), then answers `Copied`.
pub async fn copy(
    shared: &Arc<Shared>,
    sha256: String,
    send: &mut quinn::SendStream,
) -> Result<(), CoordinatorError> {
    crate::state::restore::read_blob(shared, sha256).await?;
    let limits = *shared.node.limits();
    exchange::send_message(send, &ClientReply::Copied, None, &limits).await?;
    Ok(())
}
