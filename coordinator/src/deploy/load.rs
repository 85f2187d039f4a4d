//! Loading a network: its copies planned and deployed, planned again
//! without a worker that could not take its subgraph, the placement
//! remembered for a later load of the same model, and the checks a load
//! request must pass (batching, generation, embedding).

use std::sync::Arc;

use bytes::Bytes;
use tessera_common::graph::Graph;
use tessera_common::schedule::Replicas;
use tessera_common::wire::control::LoadRequest;
use tessera_common::wire::Progress;
use tokio::sync::mpsc;

use super::deployment::deploy_planned;
use super::unload::undeploy;
use crate::network::{Deployed, Loaded, Origin, Parts, Replica};
use crate::planning::{plan_request, Scope};
use crate::{CoordinatorError, Shared};

/// Loads `model` as asked (its copies planned and deployed; its SHA-256,
/// when known, saves hashing it again); returns the loaded network (its
/// id and plan).
pub async fn load_network(
    shared: &Arc<Shared>,
    request: LoadRequest,
    (model, origin, sha256): (Bytes, Origin, Option<String>),
    progress: mpsc::Sender<Progress>,
) -> Result<Arc<Loaded>, CoordinatorError> {
    let network = shared.next_id().await;
    let source = origin.source(&request);
    let loaded = deploy_replicas(
        shared,
        network,
        request,
        (model, source.as_deref()),
        &progress,
    )
    .await?;
    let loaded = Loaded { origin, ..loaded };
    if let Some(sha256) = sha256 {
        let _ = loaded.model_sha.set(sha256);
    }
    let loaded = Arc::new(loaded);
    shared.networks.insert(network, loaded.clone());
    // Kept before the client hears of it: a coordinator restarted after
    // the answer knows the network.
    shared.state.save_network(&loaded).await;
    crate::state::lacking::keep_bones(shared, &loaded);
    if shared.ha.is_some() {
        // Every standby keeps a copy, a named model's too: a standby whose
        // host lacks the file (no volume shared) restores from its copy.
        // Hashing a language model's bytes takes a fraction of a second.
        let of = loaded.clone();
        let sha256 = tokio::task::spawn_blocking(move || of.model_sha())
            .await
            .map_err(|e| CoordinatorError::Model(format!("hashing the model failed: {e}")))?;
        crate::ha::model_copies::to_standbys(shared, &sha256).await;
    }
    crate::known::remember(shared, &loaded);
    // A mapped model (a GGUF's cached build) is read again only for a
    // re-plan: its pages go back until then.
    if let Some(model) = loaded.model() {
        tessera_gguf::pages::release(&model);
    }
    tracing::info!(network, copies = loaded.replicas.len(), "network loaded");
    Ok(loaded)
}

/// Plans the request's copies and deploys them; a worker that cannot take
/// its subgraph (its compile fails, say because it offered memory it does
/// not have, or it is lost) is left out and the copies planned again over
/// the others, until they deploy or cannot be planned. `source`: where
/// the model was read from ([`Origin::source`]).
#[tracing::instrument(name = "deploy", skip_all, fields(network = network, name = %request.name))]
async fn deploy_replicas(
    shared: &Arc<Shared>,
    network: u64,
    request: LoadRequest,
    (model, source): (Bytes, Option<&str>),
    progress: &mpsc::Sender<Progress>,
) -> Result<Loaded, CoordinatorError> {
    let mut left_out: Vec<(String, String)> = Vec::new();
    loop {
        let only: Option<Vec<String>> = (!left_out.is_empty()).then(|| {
            shared
                .workers
                .iter()
                .map(|w| w.name.clone())
                .filter(|w| left_out.iter().all(|(h, _)| h != w))
                .collect()
        });
        let scope = Scope {
            only: only.as_deref(),
            network: Some(network),
            previous: Default::default(),
            source,
        };
        let outcome = deploy_copies(shared, &request, &model, progress, scope).await;
        let note = || {
            let failed: Vec<String> = left_out
                .iter()
                .map(|(h, e)| format!("{h} could not take its subgraph ({e})"))
                .collect();
            format!("planned again without them: {}", failed.join("; "))
        };
        match outcome {
            Err(CoordinatorError::Deploy { host, error })
                if left_out.iter().all(|(h, _)| *h != host) =>
            {
                tracing::warn!(
                    "worker {host} could not take its subgraph ({error}); planning again without it"
                );
                left_out.push((host, error));
            }
            Err(CoordinatorError::Plan(why)) if !left_out.is_empty() => {
                return Err(CoordinatorError::Plan(format!("{why}; {}", note())))
            }
            Err(e) if !left_out.is_empty() => {
                return Err(CoordinatorError::Worker(format!("{e}; {}", note())))
            }
            other => return other,
        }
    }
}

/// Plans the request's copies (over the scope's workers) and deploys
/// every one at once; when one fails, the others are undeployed. The
/// scope's `previous` is the placement remembered for the same model.
async fn deploy_copies(
    shared: &Arc<Shared>,
    request: &LoadRequest,
    model: &Bytes,
    progress: &mpsc::Sender<Progress>,
    mut scope: Scope<'_>,
) -> Result<Loaded, CoordinatorError> {
    let network = scope.network.unwrap_or_default();
    let key = placement_key(request, model);
    let one_copy = request.replicas == Replicas::Count(1);
    if let (Some(p), true) = (shared.placements.get(&key), one_copy) {
        scope.previous = p.clone();
    }
    // A generative model's tokenizer is parsed beside the planning.
    let texts = request
        .generation
        .clone()
        .map(|spec| tokio::task::spawn_blocking(move || crate::generative::check_texts(&spec)));
    let scheduled =
        plan_request(shared, request, model, progress, request.replicas, &scope).await?;
    check_batching(request, &scheduled.graph)?;
    if let Some(texts) = texts {
        texts.await.map_err(|e| {
            CoordinatorError::Model(format!("checking the tokenizer failed: {e}"))
        })??;
    }
    let generator = match &request.generation {
        Some(spec) => Some(Arc::new(crate::generative::check_graph(
            spec,
            &scheduled.graph,
        )?)),
        None => None,
    };
    let embedder = crate::embedding::checked(request, &scheduled.graph)?;
    let copies = &scheduled.schedule.copies;
    let deploys = copies.iter().enumerate().map(|(i, copy)| {
        deploy_planned(
            shared,
            network,
            request,
            scheduled.copy(i),
            &copy.cost,
            progress,
            scope.source,
        )
    });
    let deployed: Vec<Result<Arc<Deployed>, CoordinatorError>> =
        futures_util::future::join_all(deploys).await;
    if let Some(at) = deployed.iter().position(Result::is_err) {
        for d in deployed.iter().flatten() {
            undeploy(shared, d.id, &d.hosts).await;
        }
        let error = deployed.into_iter().nth(at).and_then(Result::err);
        return Err(error.unwrap_or_else(|| CoordinatorError::Plan("deployment failed".into())));
    }
    let several = copies.len() > 1;
    if let (true, [Ok(only)]) = (one_copy, &deployed[..]) {
        shared.placements.insert(key, only.plan.affinity.clone());
    }
    let replicas = deployed
        .into_iter()
        .flatten()
        .zip(copies)
        .enumerate()
        .map(|(i, (d, copy))| Arc::new(Replica::new(i + 1, several.then(|| copy.hosts.clone()), d)))
        .collect();
    Ok(Loaded::new(Parts {
        id: network,
        request: request.clone(),
        model: model.clone(),
        lacking: None,
        origin: Origin::Sent,
        graph: scheduled.graph,
        types: scheduled.types,
        replicas,
        considered: scheduled.schedule.considered,
        generator,
        embedder,
    }))
}

/// What a load's remembered placement is found by: its name, size and
/// devices. A placement is only a hint (the planner keeps it only where
/// it names the model's nodes, still fits and predicts within 10 % of the
/// best cut), so a model changed under the same name costs nothing.
pub(crate) fn placement_key(request: &LoadRequest, model: &Bytes) -> String {
    format!(
        "{}|{}|{}|{:?}|{:?}",
        request.name,
        model.len(),
        request.devices,
        request.policy,
        request.shapes
    )
}

/// Dynamic batching needs a dynamic first (batch) dimension on every graph
/// input and output, and batches of at least two.
fn check_batching(request: &LoadRequest, graph: &Graph) -> Result<(), CoordinatorError> {
    let Some(batching) = request.batching else {
        return Ok(());
    };
    if batching.max_batch < 2 {
        return Err(CoordinatorError::BadInput(format!(
            "max_batch {} batches nothing: it must be at least 2",
            batching.max_batch
        )));
    }
    let static_batch = graph.inputs.iter().chain(&graph.outputs).find(|&&t| {
        let t = graph.tensor(t);
        t.shape
            .as_ref()
            .is_some_and(|s| s.first().is_none_or(|d| d.known().is_some()))
    });
    match static_batch {
        Some(&t) => {
            let t = graph.tensor(t);
            Err(CoordinatorError::BadInput(format!(
                "batching needs a dynamic first (batch) dimension, but '{}' is {}",
                t.name,
                t.type_string()
            )))
        }
        None => Ok(()),
    }
}
