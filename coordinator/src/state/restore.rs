//! A restarted coordinator's way back: every kept network is rebuilt (its
//! model read from the store or its file, its graph rebuilt from the
//! types the workers reported, nothing asked of them) with its copies'
//! deployments as they were, and the model repository's entries point at
//! them again. Nothing is deployed: the workers, which kept serving,
//! register again with what they hold, and [`adoption`] takes it as is;
//! a copy whose worker holds nothing of it (it restarted too), or has not
//! come back within [`REGISTER_AGAIN_WITHIN`] (or `worker_timeout_ms`, if
//! longer), is re-planned as after a loss.

use std::sync::Arc;
use std::time::Duration;

use tessera_common::wire::control::HeldSubgraph;

use tessera_common::onnx::bones::Bones;

use super::records::{with_tokenizer, ModelRecord, ModelRef, NetworkRecord};
use super::StoreError;
use crate::network::{Current, Loaded, Origin, Parts, Replica, SubgraphModel};
use crate::repository::{Sent, Source};
use crate::{CoordinatorError, Shared};

/// How long a restarted coordinator waits for the workers of its kept
/// deployments: a worker notices its coordinator is gone when QUIC's idle
/// timeout (5 s) passes without a packet from it, then dials again within
/// its back-off (at most 1 s).
pub const REGISTER_AGAIN_WITHIN: Duration = Duration::from_secs(8);

/// Restores what the state store keeps (logged; a network that cannot be
/// restored is forgotten, with why), then gives absent workers
/// [`REGISTER_AGAIN_WITHIN`] to register again before their copies heal.
pub async fn restore(shared: &Arc<Shared>) {
    let (networks, models) = match shared.state.load().await {
        Ok(kept) => kept,
        Err(e) => {
            tracing::error!("the kept state cannot be read, starting empty: {e}");
            return;
        }
    };
    if networks.is_empty() && models.is_empty() {
        return;
    }
    let (mut restored, mut prepared) = (0, 0);
    let mut back = Vec::new();
    for record in networks {
        let id = record.id;
        match network(shared, record).await {
            Ok((loaded, warm, from_bones)) => {
                let loaded = Arc::new(loaded);
                shared.networks.insert(id, loaded.clone());
                restored += 1;
                prepared += usize::from(warm);
                back.push((loaded, from_bones));
            }
            Err(e) => {
                tracing::warn!(network = id, "a kept network cannot be restored: {e}");
                shared.state.remove_network(id).await;
            }
        }
    }
    for record in models {
        model_entry(shared, record).await;
    }
    forget_unnamed_replaced(shared).await;
    super::save_models(shared).await;
    super::lacking::after_restore(shared, back).await;
    tracing::info!(
        networks = restored,
        prepared,
        epoch = shared.state.epoch(),
        "restored the kept state; waiting for the workers to register again"
    );
    let shared = shared.clone();
    tokio::spawn(async move {
        let timeout = Duration::from_millis(shared.config.worker_timeout_ms);
        tokio::time::sleep(timeout.max(REGISTER_AGAIN_WITHIN)).await;
        heal_absent(&shared);
    });
}

/// Waits until the workers of the kept deployments have registered again
/// (at most [`REGISTER_AGAIN_WITHIN`] after the lead began): a load just
/// after a restart or takeover is planned over all of them, not over the
/// first back.
pub async fn rejoined(shared: &Shared) {
    let Some(since) = shared.led_since.get().copied() else {
        return;
    };
    let deadline = since + REGISTER_AGAIN_WITHIN;
    loop {
        let absent = shared.networks.iter().any(|n| {
            n.deployments()
                .iter()
                .any(|d| d.hosts.iter().any(|h| !shared.workers.contains_key(h)))
        });
        if !absent || std::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What a standby prepares ahead of a takeover (HA): each kept network's
/// model bytes and rebuilt graph, by network id, with the inputs they were
/// built from; a takeover uses those that still match and prepares the
/// rest.
#[derive(Default)]
pub struct Warm(dashmap::DashMap<u64, Arc<Prepared>>);

/// A kept network's model and graph, rebuilt.
pub struct Prepared {
    /// What they were built from ([`fingerprint`]).
    fingerprint: String,
    model: bytes::Bytes,
    origin: Origin,
    sha256: String,
    graph: Arc<tessera_common::graph::Graph>,
    /// Rebuilt from the record's bones, the model's bytes being elsewhere:
    /// the bones of the weights it lacks (then `model` is their
    /// placeholder), none when the bones held it whole.
    from_bones: Option<Option<Arc<Bones>>>,
}

/// The inputs a kept network's graph is rebuilt from: where its model is
/// (with its hash), its request and the reported types.
fn fingerprint(record: &NetworkRecord) -> String {
    let tokenizer = record
        .tokenizer_json
        .as_ref()
        .map(|t| super::sha256_hex(t.as_bytes()));
    serde_json::to_string(&(&record.model, &record.request, tokenizer, &record.types))
        .unwrap_or_default()
}

/// Reads a kept network's model and rebuilds its graph.
async fn prepare(
    shared: &Arc<Shared>,
    record: &NetworkRecord,
) -> Result<Prepared, CoordinatorError> {
    let fingerprint = fingerprint(record);
    let request = with_tokenizer(record.request.clone(), record.tokenizer_json.clone());
    let (model, origin, sha256, from_bones) = match model_bytes(shared, &record.model).await {
        Ok((model, origin, sha256)) => (model, origin, sha256, None),
        Err(e) => {
            let (model, lacking) = super::lacking::from_bones(record, e).await?;
            let (origin, sha256) = match &record.model {
                ModelRef::Blob { sha256 } => (Origin::Sent, sha256.clone()),
                ModelRef::File { path, sha256 } => (Origin::File(path.clone()), sha256.clone()),
            };
            (model, origin, sha256, Some(lacking))
        }
    };
    let (types, bytes) = (record.types.clone(), model.clone());
    let graph = tokio::task::spawn_blocking(move || {
        crate::planning::rebuild_graph(&bytes, &request, &types)
    })
    .await
    .map_err(|e| CoordinatorError::Model(format!("rebuilding its graph failed: {e}")))??;
    Ok(Prepared {
        fingerprint,
        model,
        origin,
        sha256,
        graph: Arc::new(graph),
        from_bones,
    })
}

/// While standing by: prepares every kept network that changed since the
/// last look (checked every second; etcd's revisions say what changed).
pub async fn keep_warm(shared: Arc<Shared>) {
    let mut seen = None;
    loop {
        // A second first: a coordinator elected at once (the first to
        // start) restores without preparing everything twice.
        tokio::time::sleep(Duration::from_secs(1)).await;
        if shared.leads() || shared.shutting_down() {
            break;
        }
        let now = shared.state.changed_at().await;
        if now.is_some() && now != seen {
            if let Ok((networks, _)) = shared.state.load().await {
                let ids: Vec<u64> = networks.iter().map(|n| n.id).collect();
                shared.warm.0.retain(|id, _| ids.contains(id));
                for record in &networks {
                    let fresh = shared
                        .warm
                        .0
                        .get(&record.id)
                        .is_some_and(|w| w.fingerprint == fingerprint(record));
                    if !fresh {
                        match prepare(&shared, record).await {
                            Ok(p) => {
                                shared.warm.0.insert(record.id, Arc::new(p));
                            }
                            Err(e) => tracing::debug!(
                                network = record.id,
                                "preparing a kept network: {e}"
                            ),
                        }
                    }
                }
                seen = now;
            }
        }
    }
    // Leading (its restore took what matched) or stopped: nothing more to
    // keep in memory.
    shared.warm.0.clear();
}

/// A kept network, rebuilt (from what a standby prepared, when it
/// matches: then `true`), and whether from its bones.
async fn network(
    shared: &Arc<Shared>,
    mut record: NetworkRecord,
) -> Result<(Loaded, bool, bool), CoordinatorError> {
    let warm = shared.warm.0.remove(&record.id).map(|(_, p)| p);
    let (prepared, warm) = match warm {
        Some(p) if p.fingerprint == fingerprint(&record) => (p, true),
        _ => (Arc::new(prepare(shared, &record).await?), false),
    };
    record.request = with_tokenizer(record.request, record.tokenizer_json.take());
    let kept_bones = record.bones.take();
    let (model, origin, sha256) = (
        prepared.model.clone(),
        prepared.origin.clone(),
        prepared.sha256.clone(),
    );
    let graph = prepared.graph.clone();
    let generator = match &record.request.generation {
        Some(spec) => Some(Arc::new(crate::generative::check(spec, &graph)?)),
        None => None,
    };
    let embedder = crate::embedding::checked(&record.request, &graph)?;
    let replicas = record
        .replicas
        .into_iter()
        .map(|r| {
            let current = match r.deployed {
                Some(d) => Current::Ready(Arc::new(d.into_deployed(graph.clone()))),
                None => Current::Broken("it had no deployment when the coordinator stopped".into()),
            };
            Arc::new(Replica::restored(r.index, r.hosts, current, r.placement))
        })
        .collect();
    let loaded = Loaded::new(Parts {
        id: record.id,
        request: record.request,
        model,
        lacking: prepared.from_bones.clone().flatten(),
        origin,
        graph,
        types: record.types,
        replicas,
        considered: record.considered,
        generator,
        embedder,
    });
    let _ = loaded.model_sha.set(sha256);
    if let Some(bones) = kept_bones.and_then(|k| k.bones().ok()) {
        // The model is the one hashed when the record was kept.
        let _ = loaded.bones.set(Some(Arc::new(bones)));
    }
    Ok((loaded, warm, prepared.from_bones.is_some()))
}

/// A kept model's bytes, where they came from and their sha-256 (checked:
/// a file that changed since is not the model that was deployed).
async fn model_bytes(
    shared: &Arc<Shared>,
    model: &ModelRef,
) -> Result<(bytes::Bytes, Origin, String), CoordinatorError> {
    match model {
        ModelRef::Blob { sha256 } => {
            let bytes = read_blob(shared, sha256.clone()).await?;
            Ok((bytes, Origin::Sent, sha256.clone()))
        }
        ModelRef::File { path, sha256 } => {
            let read = file_bytes(path, sha256).await;
            let err = match read {
                Ok((bytes, now)) => return Ok((bytes, Origin::File(path.clone()), now)),
                Err(e) => e,
            };
            if sha256.is_empty() {
                return Err(err);
            }
            // A standby's copy (its host lacks the file, or it changed).
            let bytes = read_blob(shared, sha256.clone()).await.map_err(|copy| {
                CoordinatorError::Model(format!("{err}; no copy of the model kept: {copy}"))
            })?;
            tracing::info!(path = %path.display(), "{err}: the model read from the copy kept here");
            Ok((bytes, Origin::File(path.clone()), sha256.clone()))
        }
    }
}

/// A named model's file as it is now, and its sha-256 (an error if it is
/// not `sha256`, when that is known: not the model that was deployed).
async fn file_bytes(
    path: &std::path::Path,
    sha256: &str,
) -> Result<(bytes::Bytes, String), CoordinatorError> {
    let bytes = crate::repository::read(&Source::File(path.to_path_buf())).await?;
    let b = bytes.clone();
    let now = tokio::task::spawn_blocking(move || {
        let sha256 = super::sha256_hex(&b);
        // A mapped model (a GGUF's cached build) is read again only to
        // re-plan: its pages go back until then.
        tessera_gguf::pages::release(&b);
        sha256
    })
    .await
    .unwrap_or_default();
    if !sha256.is_empty() && now != *sha256 {
        return Err(CoordinatorError::Model(format!(
            "{} changed since it was loaded",
            path.display()
        )));
    }
    Ok((bytes, now))
}

/// Model bytes kept as a blob (a client sent them, or a standby's copy of
/// a named model's): from this coordinator's `state_dir`, else (HA, no
/// volume shared with the leader) from the leader, kept here then.
pub(crate) async fn read_blob(
    shared: &Arc<Shared>,
    sha256: String,
) -> Result<bytes::Bytes, CoordinatorError> {
    let kept = {
        let (shared, sha256) = (shared.clone(), sha256.clone());
        tokio::task::spawn_blocking(move || shared.state.blob(&sha256))
            .await
            .map_err(|e| CoordinatorError::Model(e.to_string()))?
    };
    match kept {
        Ok(bytes) => Ok(bytes),
        // Leading (a takeover's restore), there is no other leader to ask:
        // the one before is gone.
        Err(StoreError::NoBlob(_)) if shared.ha.is_some() && shared.led_since.get().is_none() => {
            let bytes = crate::ha::model_copies::from_leader(shared, &sha256).await?;
            let (keeper, b) = (shared.clone(), bytes.clone());
            let kept = tokio::task::spawn_blocking(move || keeper.state.keep_blob(&sha256, &b))
                .await
                .map_err(|e| CoordinatorError::Model(e.to_string()))?;
            if let Err(e) = kept {
                tracing::warn!("keeping model bytes the leader sent: {e}");
            }
            Ok(bytes)
        }
        Err(e) => Err(CoordinatorError::Model(e.to_string())),
    }
}

/// A kept entry of the model repository, back in it. A model the
/// configuration names keeps the configuration's definition: its kept
/// network serves it again only if it was loaded from the same definition.
async fn model_entry(shared: &Arc<Shared>, record: ModelRecord) {
    let ModelRecord {
        name,
        source,
        request,
        tokenizer_json,
        wanted,
        network,
    } = record;
    let request = with_tokenizer(request, tokenizer_json);
    let network = network.filter(|n| shared.networks.contains_key(n));
    if let Some(entry) = shared.repository.get(&name) {
        let same = matches!(&source, ModelRef::File { path, .. }
            if matches!(entry.source(), Source::File(p) if p == *path))
            && entry.request() == request;
        if same && wanted {
            if let Some(n) = network {
                entry.attach(n);
            }
        }
        return;
    }
    let source = match source {
        ModelRef::File { path, .. } => Source::File(path),
        ModelRef::Blob { sha256 } => match read_blob(shared, sha256.clone()).await {
            Ok(bytes) => Source::Bytes(Sent::hashed(bytes, sha256)),
            Err(e) => match network.and_then(|n| shared.networks.get(&n)) {
                // Its network was restored from its bones: the model's
                // bytes are its, or taken back with it.
                Some(n) if n.model_sha() == sha256 => match n.model() {
                    Some(bytes) => Source::Bytes(Sent::hashed(bytes, sha256)),
                    None => Source::Bytes(Sent::lacking(sha256)),
                },
                _ => {
                    tracing::warn!(model = %name, "a kept model cannot be restored: {e}");
                    return;
                }
            },
        },
    };
    shared
        .repository
        .restore(&name, source, request, wanted, network);
}

/// Networks kept for a named model that no entry points at any more (the
/// configuration redefined the model): unloaded, as a replaced network is.
async fn forget_unnamed_replaced(shared: &Arc<Shared>) {
    let named: Vec<u64> = shared.repository.networks();
    let orphans: Vec<u64> = shared
        .networks
        .iter()
        .filter(|n| matches!(n.origin, Origin::File(_)) && !named.contains(&n.id))
        .map(|n| n.id)
        .collect();
    for id in orphans {
        tracing::info!(
            network = id,
            "a kept network of a redefined named model: unloaded"
        );
        if let Err(e) = crate::deploy::unload(shared, id).await {
            tracing::debug!("{e}");
        }
    }
}

/// Copies with a worker that has not registered again: healed as after a
/// loss.
fn heal_absent(shared: &Arc<Shared>) {
    let mut absent: Vec<String> = shared
        .networks
        .iter()
        .flat_map(|n| n.deployments())
        .flat_map(|d| d.hosts.clone())
        .filter(|h| !shared.workers.contains_key(h))
        .collect();
    absent.sort();
    absent.dedup();
    for host in absent {
        tracing::warn!(worker = %host, "did not register again after the restart: its copies heal");
        crate::heal::worker_lost(shared, &host);
    }
}

/// What a registering worker brings.
pub struct Adoption {
    /// The ready deployments on it it holds every subgraph of.
    pub adopted: Vec<u64>,
    /// The copies whose subgraphs there it lacks (to re-plan).
    pub lacking: Vec<(Arc<Loaded>, Arc<Replica>)>,
}

/// What registering worker `name`, holding `holds`, brings.
pub fn adoption(shared: &Shared, name: &str, holds: &[HeldSubgraph]) -> Adoption {
    let mut adopted = Vec::new();
    let mut lacking = Vec::new();
    for loaded in shared.networks.iter() {
        for replica in &loaded.replicas {
            let Current::Ready(d) = replica.current() else {
                continue;
            };
            if !d.hosts.iter().any(|h| h == name) {
                continue;
            }
            if holds_all(d.id, &d.models, name, holds) {
                adopted.push(d.id);
            } else {
                lacking.push((loaded.clone(), replica.clone()));
            }
        }
    }
    Adoption { adopted, lacking }
}

/// Whether worker `name` holds every subgraph of deployment `id` that
/// `models` places on it, each with the same model hash.
fn holds_all(id: u64, models: &[SubgraphModel], name: &str, holds: &[HeldSubgraph]) -> bool {
    models.iter().filter(|m| m.host == name).all(|m| {
        holds
            .iter()
            .any(|h| h.deployment == id && h.subgraph == m.subgraph && h.model_hash == m.model_hash)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(host: &str, subgraph: u32, hash: &str) -> SubgraphModel {
        SubgraphModel {
            host: host.into(),
            subgraph,
            model_hash: hash.into(),
        }
    }

    fn held(deployment: u64, subgraph: u32, hash: &str) -> HeldSubgraph {
        HeldSubgraph {
            deployment,
            subgraph,
            model_hash: hash.into(),
        }
    }

    #[test]
    fn a_deployment_is_adopted_only_with_every_subgraph_of_the_worker_and_the_same_hashes() {
        let models = [
            model("a", 0, "h0"),
            model("b", 1, "h1"),
            model("a", 2, "h2"),
        ];
        let all = [held(5, 0, "h0"), held(5, 2, "h2")];
        assert!(holds_all(5, &models, "a", &all));
        // Another worker's subgraph is not asked of this one.
        assert!(holds_all(5, &models, "b", &[held(5, 1, "h1")]));
        // One missing, another deployment's, another model: not adopted.
        assert!(!holds_all(5, &models, "a", &all[..1]));
        assert!(!holds_all(
            5,
            &models,
            "a",
            &[held(6, 0, "h0"), held(6, 2, "h2")]
        ));
        assert!(!holds_all(
            5,
            &models,
            "a",
            &[held(5, 0, "h0"), held(5, 2, "other")]
        ));
        // A worker that restarted holds nothing.
        assert!(!holds_all(5, &models, "a", &[]));
    }
}
