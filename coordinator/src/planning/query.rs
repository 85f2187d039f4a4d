//! QueryNetwork fanned out to the workers of the devices a load names,
//! concurrently, and a client's `tessera query` answered from it.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use tessera_common::affinity::DeviceId;
use tessera_common::onnx::skeleton::skeleton;
use tessera_common::onnx::{decode_model_shared, encode_model};
use tessera_common::wire::cluster::{ToWorker, WorkerAnswer};
use tessera_common::wire::control::DeviceAnswer;
use tessera_common::wire::{Message, Progress};
use tokio::sync::mpsc;

use super::devices::devices;
use crate::workers::WorkerEntry;
use crate::{futures_join, CoordinatorError, Shared};

/// Workers by name, with the device kinds asked of each.
pub(crate) type ByHost = BTreeMap<String, (Arc<WorkerEntry>, Vec<String>)>;

/// QueryNetwork for `devices`, one stream per worker, all at once.
pub(super) async fn query_all(
    shared: &Arc<Shared>,
    devices: &[(DeviceId, Arc<WorkerEntry>)],
    model: &Bytes,
    progress: &mpsc::Sender<Progress>,
) -> Result<(ByHost, Vec<(DeviceId, DeviceAnswer)>), CoordinatorError> {
    let limits = *shared.node.limits();
    let mut by_host: ByHost = BTreeMap::new();
    for (d, w) in devices {
        let entry = by_host
            .entry(w.name.clone())
            .or_insert_with(|| (w.clone(), Vec::new()));
        if !entry.1.contains(&d.name) {
            entry.1.push(d.name.clone());
        }
    }
    let skeleton = tessera_common::wire::pieces::sha256_hex(model);
    let queries = by_host.values().map(|(w, kinds)| {
        let msg = ToWorker::QueryNetwork {
            devices: kinds.clone(),
            epoch: w.epoch,
        };
        let asked = format!("{skeleton}|{}", kinds.join(","));
        async move {
            let memo = w.answers.lock().ok().and_then(|m| m.get(&asked));
            if let Some(answers) = memo {
                return Ok((w.name.clone(), answers));
            }
            let _ = progress
                .send(Progress {
                    what: format!("QueryNetwork on {}", w.name),
                    done: 0,
                    total: 1,
                })
                .await;
            let answer = w.ask(&limits, &msg, Some(model), None).await?;
            match answer {
                WorkerAnswer::QueryResult { answers } => {
                    if let Ok(mut memo) = w.answers.lock() {
                        memo.put(asked, answers.clone());
                    }
                    Ok((w.name.clone(), answers))
                }
                other => Err(CoordinatorError::Worker(format!(
                    "worker {} answered QueryNetwork with {}",
                    w.name,
                    other.name()
                ))),
            }
        }
    });
    let mut out = Vec::new();
    for (host, answers) in futures_join(queries).await? {
        for a in answers {
            let id = devices
                .iter()
                .map(|(d, _)| d)
                .find(|d| d.host.as_deref() == Some(host.as_str()) && d.name == a.device);
            if let Some(id) = id {
                out.push((id.clone(), a));
            }
        }
    }
    Ok((by_host, out))
}

/// Which nodes each `host/DEVICE` of `spec` supports (a client's
/// `tessera query`); answers are named `host/DEVICE`.
pub async fn query(
    shared: &Arc<Shared>,
    spec: &str,
    model: Bytes,
    progress: mpsc::Sender<Progress>,
) -> Result<Vec<DeviceAnswer>, CoordinatorError> {
    let proto = decode_model_shared(model).map_err(|e| CoordinatorError::Model(e.to_string()))?;
    let bones = Bytes::from(encode_model(&skeleton(&proto)));
    let devices = devices(shared, spec, None)?;
    let (_, answers) = query_all(shared, &devices, &bones, &progress).await?;
    Ok(answers
        .into_iter()
        .map(|(id, a)| DeviceAnswer {
            device: id.to_string(),
            ..a
        })
        .collect())
}
