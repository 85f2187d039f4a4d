//! A coordinator's ask for weights by hash ([`ToWorker::Weights`]): one
//! that lost a model's bytes takes its weights back from the workers that
//! hold them, from their weight store or the model on their own disk.
//!
//! [`ToWorker::Weights`]: tessera_common::wire::cluster::ToWorker::Weights

use std::sync::Arc;

use bytes::Bytes;
use tessera_common::wire::pieces::PieceRef;

use super::operations::{from_own_disk, OperationError};
use super::State;

/// The indices of the weights in `sha256` this worker holds (each checked
/// against its hash), and their bytes one after another.
pub(super) async fn held(
    state: &Arc<State>,
    sha256: Vec<String>,
    source: Option<String>,
) -> Result<(Vec<u32>, Bytes), OperationError> {
    let (store, local) = (state.weights.clone(), state.local_models.clone());
    tokio::task::spawn_blocking(move || {
        let mut held: Vec<Option<Bytes>> = sha256
            .iter()
            .map(|sha| store.as_ref().and_then(|s| s.get(sha)))
            .collect();
        if let (true, Some(local), Some(source)) = (held.iter().any(Option::is_none), local, source)
        {
            let pieces: Vec<PieceRef> = sha256
                .iter()
                .map(|sha| PieceRef::Weight {
                    sha256: sha.clone(),
                    bytes: 0,
                })
                .collect();
            from_own_disk(&local, &source, &pieces, &mut held);
        }
        let indices: Vec<u32> = (0..held.len() as u32)
            .filter(|&i| held[i as usize].is_some())
            .collect();
        let mut payload = Vec::with_capacity(held.iter().flatten().map(Bytes::len).sum());
        held.iter()
            .flatten()
            .for_each(|w| payload.extend_from_slice(w));
        tracing::info!(
            asked = sha256.len(),
            held = indices.len(),
            bytes = payload.len(),
            "weights sent back to the coordinator"
        );
        (indices, Bytes::from(payload))
    })
    .await
    .map_err(OperationError::Task)
}
