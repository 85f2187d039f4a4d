//! Every stage of a plan exported as its own model, as pieces (its
//! weights slices of the model the coordinator holds once), and hashed.

use std::sync::Arc;

use tessera_common::graph::Graph;
use tessera_common::onnx::parts::{encode_model_parts, Part};
use tessera_common::wire::pieces::{self, PieceRef};

use crate::CoordinatorError;

/// A stage's model as pieces, its layout and its content hash.
pub(super) struct Exported {
    pub parts: Vec<Part>,
    pub pieces: Vec<PieceRef>,
    pub model_hash: String,
}

/// Every stage's model, exported and hashed off the async threads, the
/// stages side by side (hashing a language model's weights takes a
/// fraction of a second per stage).
pub(super) async fn export_stages(
    graph: &Arc<Graph>,
    plan: &tessera_common::plan::Plan,
) -> Result<Vec<Exported>, CoordinatorError> {
    let (graph, plan) = (graph.clone(), plan.clone());
    let started = std::time::Instant::now();
    let exported: Result<Vec<Exported>, CoordinatorError> =
        tokio::task::spawn_blocking(move || {
            std::thread::scope(|scope| {
                let threads: Vec<_> = (0..plan.stages.len())
                    .map(|i| {
                        let (graph, plan) = (&graph, &plan);
                        scope.spawn(move || {
                            let model = plan
                                .export_stage(graph, i)
                                .map_err(|e| CoordinatorError::Plan(e.to_string()))?;
                            let parts = encode_model_parts(&model);
                            // A mapped model's pages are given back as
                            // they are hashed: read again when sent.
                            let (pieces, model_hash) =
                                pieces::layout_with(&parts, |w| tessera_gguf::pages::release(w));
                            Ok::<_, CoordinatorError>(Exported {
                                parts,
                                pieces,
                                model_hash,
                            })
                        })
                    })
                    .collect();
                threads
                    .into_iter()
                    .map(|t| {
                        t.join().unwrap_or_else(|_| {
                            Err(CoordinatorError::Plan("exporting a stage failed".into()))
                        })
                    })
                    .collect()
            })
        })
        .await
        .map_err(|e| CoordinatorError::Plan(format!("exporting the stages failed: {e}")))?;
    if let Ok(stages) = &exported {
        tracing::info!(
            stages = stages.len(),
            exported_ms = started.elapsed().as_millis(),
            "stages exported and hashed"
        );
    }
    exported
}
