//! Networks restored without their model's bytes: a standby with a
//! `state_dir` of its own that never got a copy, or a restart that lost
//! its blob or whose model file is gone or changed. Such a network is not
//! dropped. Its record keeps the model's bones
//! ([`tessera_common::onnx::bones`]: the frames, the large weights by
//! hash), so it is rebuilt from them with zeros for weights, and its
//! deployments are adopted and served as they are. The coordinator says
//! what it lacks, and, once the workers of its deployments have registered
//! again, takes the weights back from them ([`ToWorker::Weights`]: their
//! weight stores, or the model on their own disk), each checked against
//! its hash and the whole model against the record's SHA-256. Only then
//! can it be planned again; a re-plan that finds it still lacking asks
//! the workers once more, then fails saying what is missing.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tessera_common::onnx::bones::{self, Bones};
use tessera_common::wire::cluster::{ToWorker, WorkerAnswer};
use tessera_common::wire::Message;
use tessera_net::exchange;

use super::records::{ModelRef, NetworkRecord};
use crate::network::Loaded;
use crate::repository::{Sent, Source};
use crate::workers::WorkerEntry;
use crate::{CoordinatorError, Shared};

const MIB: f64 = (1u64 << 20) as f64;

/// A kept network's model from its record's bones, its bytes being
/// nowhere else (`why`): the model itself when the bones hold all of it
/// (checked against the record's SHA-256), else their placeholder with
/// the bones of the weights it lacks. `why` when it has no bones.
pub(super) async fn from_bones(
    record: &NetworkRecord,
    why: CoordinatorError,
) -> Result<(Bytes, Option<Arc<Bones>>), CoordinatorError> {
    let Some(kept) = &record.bones else {
        return Err(why);
    };
    let bones = kept
        .bones()
        .map_err(|e| CoordinatorError::Model(format!("{why}; {e}")))?;
    let sha256 = match &record.model {
        ModelRef::Blob { sha256 } | ModelRef::File { sha256, .. } => sha256.clone(),
    };
    let bones = Arc::new(bones);
    let b = bones.clone();
    let made = tokio::task::spawn_blocking(move || {
        if b.weights().is_empty() {
            let model = b.model(&HashMap::new())?;
            let sha256 = super::sha256_hex(&model);
            Ok((model, Some(sha256)))
        } else {
            b.placeholder().map(|m| (m, None))
        }
    })
    .await
    .map_err(|e| CoordinatorError::Model(format!("{why}; its bones: {e}")))?
    .map_err(|e| CoordinatorError::Model(format!("{why}; its bones: {e}")))?;
    match made {
        (model, Some(got)) if sha256.is_empty() || got == sha256 => {
            tracing::info!(
                network = record.id,
                bytes = model.len(),
                "{why}: its model, small enough, was whole in its record"
            );
            Ok((model, None))
        }
        (_, Some(got)) => Err(CoordinatorError::Model(format!(
            "{why}; its record's model has sha-256 {got}, not {sha256}"
        ))),
        (model, None) => {
            let weights = bones.weights();
            let bytes: u64 = weights.iter().map(|(_, b)| b).sum();
            tracing::warn!(
                network = record.id,
                weights = weights.len(),
                lacking_mib = format!("{:.1}", bytes as f64 / MIB),
                "{why}: restored from its record without its weights; its deployments are \
                 served as they are, and its weights will be asked of the workers"
            );
            Ok((model, Some(bones)))
        }
    }
}

/// Computes `loaded`'s bones off the load's path (hashing every large
/// weight of a language model takes a second or more) and keeps its
/// record again with them.
pub(crate) fn keep_bones(shared: &Arc<Shared>, loaded: &Arc<Loaded>) {
    if !shared.state.keeps() || loaded.bones.get().is_some() {
        return;
    }
    let (shared, loaded) = (shared.clone(), loaded.clone());
    tokio::spawn(async move {
        let of = loaded.clone();
        let bones = tokio::task::spawn_blocking(move || of.bones()).await;
        if matches!(bones, Ok(Some(_))) && shared.networks.contains_key(&loaded.id) {
            shared.state.save_network(&loaded).await;
        }
    });
}

/// After a restore, each network (`true`: restored from its record's
/// bones): one restored whole from them is kept again (a sent model's
/// blob with it); one lacking weights takes them back from its workers
/// once these have registered again; the others' bones are kept if their
/// records had none.
pub(super) async fn after_restore(shared: &Arc<Shared>, networks: Vec<(Arc<Loaded>, bool)>) {
    for (loaded, from_bones) in networks {
        if loaded.lacking().is_none() {
            if from_bones {
                shared.state.save_network(&loaded).await;
            }
            keep_bones(shared, &loaded);
            continue;
        }
        let shared = shared.clone();
        tokio::spawn(async move {
            super::restore::rejoined(&shared).await;
            if let Err(e) = model_of(&shared, &loaded).await {
                tracing::error!(network = loaded.id, "{e}");
            }
        });
    }
}

/// `loaded`'s model, taken back from the workers first if it lacks it.
pub(crate) async fn model_of(
    shared: &Arc<Shared>,
    loaded: &Loaded,
) -> Result<Bytes, CoordinatorError> {
    if let Some(model) = loaded.model() {
        return Ok(model);
    }
    let _one = loaded.completing.lock().await;
    let Some(bones) = loaded.lacking() else {
        // Taken back meanwhile.
        return loaded
            .model()
            .ok_or_else(|| CoordinatorError::Model("the model's bytes vanished".into()));
    };
    let model = take_back(shared, loaded, &bones).await?;
    loaded.complete(model.clone());
    let sha256 = loaded.model_sha();
    for name in shared.repository.names() {
        let Some(entry) = shared.repository.get(&name) else {
            continue;
        };
        if matches!(entry.source(), Source::Bytes(s) if s.lacking && s.sha256() == sha256) {
            entry.set_source(Source::Bytes(Sent::hashed(model.clone(), sha256.clone())));
        }
    }
    let kept = shared.networks.get(&loaded.id).map(|n| n.value().clone());
    if let Some(kept) = kept {
        shared.state.save_network(&kept).await;
    }
    super::save_models(shared).await;
    Ok(model)
}

/// The model of `bones`, its weights asked of every registered worker (the
/// workers of `loaded`'s deployments first) until none lacks.
async fn take_back(
    shared: &Arc<Shared>,
    loaded: &Loaded,
    bones: &Arc<Bones>,
) -> Result<Bytes, CoordinatorError> {
    let wanted: Vec<(String, u64)> = bones
        .weights()
        .into_iter()
        .map(|(s, b)| (s.to_string(), b))
        .collect();
    let hosts: Vec<String> = loaded
        .deployments()
        .iter()
        .flat_map(|d| d.hosts.clone())
        .collect();
    let mut workers: Vec<Arc<WorkerEntry>> =
        shared.workers.iter().map(|w| w.value().clone()).collect();
    workers.sort_by_key(|w| (!hosts.contains(&w.name), w.name.clone()));
    let (source, limits) = (loaded.source(), *shared.node.limits());
    let mut found: HashMap<String, Bytes> = HashMap::new();
    let mut from = Vec::new();
    for worker in &workers {
        let asked: Vec<(String, u64)> = wanted
            .iter()
            .filter(|(s, _)| !found.contains_key(s))
            .cloned()
            .collect();
        if asked.is_empty() {
            break;
        }
        match ask(worker, &limits, asked, source.clone()).await {
            Ok(got) if got.is_empty() => {}
            Ok(got) => {
                from.push(format!("{} from {}", got.len(), worker.name));
                found.extend(got);
            }
            Err(e) => tracing::warn!(worker = %worker.name, "taking weights back: {e}"),
        }
    }
    let (b, sha256) = (bones.clone(), loaded.model_sha());
    let model = tokio::task::spawn_blocking(move || {
        let model = b.model(&found).map_err(|e| e.to_string())?;
        let got = super::sha256_hex(&model);
        if !sha256.is_empty() && got != sha256 {
            return Err(format!(
                "the weights make a model with sha-256 {got}, not {sha256}"
            ));
        }
        Ok(model)
    })
    .await
    .map_err(|e| CoordinatorError::Model(e.to_string()))?;
    let model = model.map_err(|e| {
        let asked: Vec<&str> = workers.iter().map(|w| w.name.as_str()).collect();
        CoordinatorError::Model(format!(
            "network {} lacks its model's bytes (this coordinator was restored without them): \
             {e}, asked of {}; load it again with its bytes",
            loaded.id,
            if asked.is_empty() {
                "no registered worker".to_string()
            } else {
                asked.join(", ")
            }
        ))
    })?;
    tracing::info!(
        network = loaded.id,
        weights = wanted.len(),
        mib = format!("{:.1}", model.len() as f64 / MIB),
        from = from.join(", "),
        "its model's weights taken back from the workers; the model's sha-256 checked"
    );
    Ok(model)
}

/// The weights of `asked` that `worker` holds, each checked.
async fn ask(
    worker: &WorkerEntry,
    limits: &tessera_common::wire::Limits,
    asked: Vec<(String, u64)>,
    source: Option<String>,
) -> Result<Vec<(String, Bytes)>, String> {
    let msg = ToWorker::Weights {
        sha256: asked.iter().map(|(s, _)| s.clone()).collect(),
        source,
        epoch: worker.epoch,
    };
    let (mut send, mut recv) = exchange::open(&worker.connection)
        .await
        .map_err(|e| e.to_string())?;
    exchange::send_message(&mut send, &msg, None, limits)
        .await
        .map_err(|e| e.to_string())?;
    let _ = send.finish();
    let (answer, payload) =
        exchange::answer_with_payload::<WorkerAnswer>(&mut recv, limits, |_| {})
            .await
            .map_err(|e| e.to_string())?;
    let WorkerAnswer::Weights { held } = answer else {
        return Err(format!("it answered {}", answer.name()));
    };
    tokio::task::spawn_blocking(move || bones::received(&asked, &held, &payload))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}
