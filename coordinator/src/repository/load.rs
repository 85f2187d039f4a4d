//! Loading and unloading named models: one load or unload of a model at
//! a time, a new network replacing the old one only once deployed, and
//! the progress of loads nobody watches sent to the log.

use std::sync::Arc;
use std::time::Instant;

use tessera_common::wire::control::LoadRequest;
use tessera_common::wire::Progress;
use tokio::sync::mpsc;

use super::files::{read_with_spec, with_embedding_tokenizer};
use super::registry::{Entry, Source};
use super::status::{absent_workers, worker_names};
use crate::config::valid_model_name;
use crate::network::{Loaded, Origin};
use crate::{deploy, CoordinatorError, Shared};

/// Loads model `name`, or answers with its network if it is loaded and
/// nothing new is given. With `new` (bytes and how to place them) the
/// model is (re)defined: the new network replaces the old one once it is
/// deployed, so requests by name never find it missing.
pub async fn load(
    shared: &Arc<Shared>,
    name: &str,
    new: Option<(Source, LoadRequest)>,
    progress: mpsc::Sender<Progress>,
) -> Result<Arc<Loaded>, CoordinatorError> {
    load_entry(shared, name, new, Keep::No, progress).await
}

/// What [`keep_loaded`](super::keep_loaded) asks of a load.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Keep {
    /// An explicit load (SDK, CLI, HTTP): as requested, strictly.
    No,
    /// Only if still wanted (an unload meanwhile wins); `without_absent`:
    /// leaving out workers the request names that are not registered;
    /// `replace`: planned again even if loaded (a degraded load whose
    /// workers are all back).
    Yes { without_absent: bool, replace: bool },
}

pub(super) async fn load_entry(
    shared: &Arc<Shared>,
    name: &str,
    new: Option<(Source, LoadRequest)>,
    keep: Keep,
    progress: mpsc::Sender<Progress>,
) -> Result<Arc<Loaded>, CoordinatorError> {
    if !valid_model_name(name) {
        return Err(CoordinatorError::Model(format!(
            "'{name}' is not a model name (1-128 of A-Z a-z 0-9 _ . -, not starting with '.')"
        )));
    }
    let entry = match (shared.repository.get(name), &new) {
        (Some(e), _) => e,
        (None, Some((source, request))) => {
            shared
                .repository
                .insert(name, source.clone(), request.clone(), false)
        }
        (None, None) => return Err(CoordinatorError::UnknownModel(name.into())),
    };
    let _busy = entry.busy.lock().await;
    let replacing = new.is_some() || matches!(keep, Keep::Yes { replace: true, .. });
    let without_absent = matches!(
        keep,
        Keep::Yes {
            without_absent: true,
            ..
        }
    );
    {
        let mut s = entry.lock();
        if let Some((source, mut request)) = new {
            request.name = name.to_string();
            request.dry_run = false;
            s.source = source;
            s.request = request;
            s.graph = None;
        }
        if keep != Keep::No && !s.wanted {
            return Err(CoordinatorError::NotReady(format!(
                "model {name} was unloaded"
            )));
        }
        s.wanted = true;
        if !replacing {
            if let Some(l) = s
                .network
                .and_then(|n| shared.networks.get(&n).map(|l| l.clone()))
            {
                return Ok(l);
            }
        }
        s.loading = true;
    }
    let result = load_now(shared, &entry, without_absent, progress).await;
    let old = {
        let mut s = entry.lock();
        s.loading = false;
        match &result {
            Ok(loaded) => {
                s.failure = None;
                s.degraded = without_absent;
                s.graph = Some(loaded.graph.clone());
                s.network.replace(loaded.id)
            }
            Err(e) => {
                s.failure = Some((e.to_string(), worker_names(shared), Instant::now()));
                None
            }
        }
    };
    shared.repository.changed();
    crate::state::save_models(shared).await;
    if let Some(old) = old {
        if let Err(e) = deploy::unload(shared, old).await {
            tracing::debug!(model = name, "replaced network {old}: {e}");
        }
    }
    result
}

async fn load_now(
    shared: &Arc<Shared>,
    entry: &Entry,
    without_absent: bool,
    progress: mpsc::Sender<Progress>,
) -> Result<Arc<Loaded>, CoordinatorError> {
    let (source, mut request) = {
        let s = entry.lock();
        (s.source.clone(), s.request.clone())
    };
    let max_sequences = request.generation.as_ref().map_or(1, |g| g.max_sequences);
    let (bytes, spec) = read_with_spec(&source, max_sequences).await?;
    if let (Some(spec), Some(wanted)) = (spec, &request.generation) {
        if wanted.tokenizer_json.is_empty() {
            request.generation = Some(spec.limited_by(wanted));
        }
    }
    if let Some(embedding) = request.embedding.take() {
        request.embedding = Some(with_embedding_tokenizer(embedding).await?);
    }
    let absent = absent_workers(shared, &request);
    if without_absent && !absent.is_empty() {
        tracing::warn!(
            model = %entry.name,
            "loading without workers {} (named by its devices or pins, not registered)",
            absent.join(", ")
        );
        request = crate::heal::without_lost(shared, &request)?;
    }
    tracing::info!(model = %entry.name, "loading named model");
    let origin = match source {
        Source::File(path) => Origin::File(path),
        Source::Bytes(_) => Origin::Sent,
    };
    deploy::load_network(shared, request, (bytes, origin, None), progress).await
}

/// Unloads model `name`: it stays in the repository, not wanted, until it
/// is loaded again.
pub async fn unload(shared: &Arc<Shared>, name: &str) -> Result<(), CoordinatorError> {
    let entry = shared
        .repository
        .get(name)
        .ok_or_else(|| CoordinatorError::UnknownModel(name.into()))?;
    let _busy = entry.busy.lock().await;
    let network = {
        let mut s = entry.lock();
        s.wanted = false;
        s.failure = None;
        s.network.take()
    };
    if let Some(network) = network {
        deploy::unload(shared, network).await?;
    } else {
        crate::state::save_models(shared).await;
    }
    tracing::info!(model = name, "named model unloaded");
    Ok(())
}

/// A progress channel whose reports go to the debug log (loads nobody
/// watches: at start, over HTTP).
pub fn progress_log(model: &str) -> mpsc::Sender<Progress> {
    let (tx, mut rx) = mpsc::channel(64);
    let model = model.to_string();
    tokio::spawn(async move {
        while let Some(Progress { what, done, total }) = rx.recv().await {
            tracing::debug!(%model, "[{done}/{total}] {what}");
        }
    });
    tx
}
