//! Shipping a deployment's subgraphs to their workers at once: each
//! Deploy exchange, its model streamed with byte progress only when the
//! worker's compile cache lacks it, less the weights the worker holds.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tessera_common::wire::cluster::{ToWorker, WorkerAnswer};
use tessera_common::wire::pieces::{self, PieceRef};
use tessera_common::wire::{Limits, Message, Progress};
use tessera_net::exchange;
use tokio::sync::mpsc;

use super::specs::Shipment;
use crate::planning::ByHost;
use crate::workers::WorkerEntry;
use crate::{futures_join, CoordinatorError, Shared};

/// Deploys every subgraph at once, reporting each as it is deployed.
pub(super) async fn ship(
    shared: &Arc<Shared>,
    by_host: &ByHost,
    specs: &[Shipment],
    progress: &mpsc::Sender<Progress>,
) -> Result<(), CoordinatorError> {
    let total = specs.len() as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let limits = *shared.node.limits();
    let deploys = specs.iter().map(|shipment| {
        let done = &done;
        let host = &shipment.host;
        async move {
            let worker = by_host.get(host).map(|(w, _)| w.clone()).ok_or_else(|| {
                CoordinatorError::Deploy {
                    host: host.clone(),
                    error: "it is gone".into(),
                }
            })?;
            match deploy_one(&worker, &limits, shipment, progress).await? {
                WorkerAnswer::Deployed { .. } => {
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    let step = Progress {
                        what: "deployed subgraphs".into(),
                        done: n,
                        total,
                    };
                    let _ = progress.send(step).await;
                    Ok(())
                }
                other => Err(CoordinatorError::Worker(format!(
                    "worker {host} answered Deploy with {}",
                    other.name()
                ))),
            }
        }
    });
    futures_join(deploys).await.map(|_| ())
}

/// A mapped model's pieces sent this many bytes ago have their pages
/// given back (quinn keeps a chunk until the worker acknowledges it).
const RELEASE_BEHIND: u64 = 4 << 20;

/// Gives back the pages of a payload's pieces as they are sent
/// ([`tessera_gguf::pages`]: only those of a mapped model).
struct SentPages<'a> {
    pieces: &'a [bytes::Bytes],
    next: usize,
    /// Where `pieces[next]` starts in the payload.
    at: u64,
}

impl<'a> SentPages<'a> {
    fn new(pieces: &'a [bytes::Bytes]) -> Self {
        SentPages {
            pieces,
            next: 0,
            at: 0,
        }
    }

    /// Gives back every piece that ended [`RELEASE_BEHIND`] before `done`.
    fn release_upto(&mut self, done: u64) {
        while let Some(piece) = self.pieces.get(self.next) {
            let end = self.at + piece.len() as u64;
            if end + RELEASE_BEHIND > done {
                return;
            }
            tessera_gguf::pages::release(piece);
            (self.next, self.at) = (self.next + 1, end);
        }
    }
}

/// Progress is reported at most every this many bytes of a model.
const PROGRESS_EVERY: u64 = 8 << 20;

/// One subgraph's Deploy exchange: the spec; the model, streamed from the
/// pieces with byte progress, only if the worker asks for it (its compile
/// cache lacks it), less the weights it holds; then the worker's answer.
async fn deploy_one(
    worker: &WorkerEntry,
    limits: &Limits,
    shipment: &Shipment,
    progress: &mpsc::Sender<Progress>,
) -> Result<WorkerAnswer, CoordinatorError> {
    let failed = |error: String| CoordinatorError::Deploy {
        host: worker.name.clone(),
        error,
    };
    let name = &worker.name;
    let (mut send, mut recv) = exchange::open(&worker.connection)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let msg = ToWorker::Deploy {
        spec: Box::new(shipment.spec.clone()),
        epoch: worker.epoch,
    };
    exchange::send_message(&mut send, &msg, None, limits)
        .await
        .map_err(|e| failed(e.to_string()))?;
    loop {
        let answer = exchange::answer::<WorkerAnswer>(&mut recv, limits, |p| {
            let _ = progress.try_send(p);
        })
        .await
        .map_err(|e| failed(e.to_string()))?;
        let WorkerAnswer::NeedModel { missing } = answer else {
            let _ = send.finish();
            return Ok(answer);
        };
        let spec = &shipment.spec;
        pieces::check_missing(&spec.pieces, &missing)
            .map_err(|e| failed(format!("its ask for the model: {e}")))?;
        let total = pieces::payload_len(&spec.pieces, &missing);
        tracing::info!(
            subgraph = spec.subgraph,
            host = %name,
            sending = total,
            of = spec.model_bytes,
            weights_held = spec.pieces.iter().filter(|p| matches!(p, PieceRef::Weight { .. })).count() - missing.len(),
            "sending the subgraph's model"
        );
        let what = format!("sending subgraph {} to {name}", spec.subgraph);
        let payload = pieces::payload(&shipment.model, &missing);
        let mut sent_pages = SentPages::new(&payload);
        let mut reported = 0;
        let report = |done: u64| {
            sent_pages.release_upto(done);
            if done == total || done >= reported + PROGRESS_EVERY {
                reported = done;
                let step = Progress {
                    what: what.clone(),
                    done,
                    total,
                };
                let _ = progress.try_send(step);
            }
        };
        let sent =
            exchange::send_message_parts(&mut send, &ToWorker::Model, &payload, limits, report)
                .await;
        payload.iter().for_each(|p| tessera_gguf::pages::release(p));
        if let Err(e) = sent {
            // The worker stopped reading: its answer says why, if it gave one.
            let why = tokio::time::timeout(
                std::time::Duration::from_secs(2),
                exchange::answer::<WorkerAnswer>(&mut recv, limits, |_| {}),
            )
            .await;
            return Err(failed(match why {
                Ok(Err(reason @ exchange::ExchangeError::Failed { .. })) => reason.to_string(),
                _ => format!("sending the model: {e}"),
            }));
        }
        let _ = send.finish();
    }
}
