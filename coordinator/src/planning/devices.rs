//! The devices a load request names, each with the worker that has it.

use std::sync::Arc;

use tessera_common::affinity::{DeviceId, DevicePriority};

use crate::workers::WorkerEntry;
use crate::{CoordinatorError, Shared};

/// The devices a load request names, each with its worker. Bare kinds
/// (`CPU`) mean that kind on every worker that has it; no devices at all
/// means every device of every worker.
pub(super) fn devices(
    shared: &Shared,
    spec: &str,
    only: Option<&[String]>,
) -> Result<Vec<(DeviceId, Arc<WorkerEntry>)>, CoordinatorError> {
    let mut workers: Vec<Arc<WorkerEntry>> = shared
        .workers
        .iter()
        .filter(|w| only.is_none_or(|hosts| hosts.contains(&w.name)))
        .filter(|w| !w.draining())
        .map(|w| w.clone())
        .collect();
    workers.sort_by(|a, b| a.name.cmp(&b.name));
    if workers.is_empty() {
        return Err(CoordinatorError::Devices(match only {
            Some(hosts) => format!("none of its workers ({}) is connected", hosts.join(", ")),
            None => "no worker is registered".into(),
        }));
    }
    let known = || {
        workers
            .iter()
            .flat_map(|w| {
                w.devices
                    .iter()
                    .map(move |d| format!("{}/{}", w.name, d.device))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let wanted: Vec<DeviceId> = if spec.trim().is_empty() {
        workers
            .iter()
            .flat_map(|w| {
                w.devices.iter().map(|d| DeviceId {
                    host: Some(w.name.clone()),
                    name: d.device.clone(),
                    index: None,
                })
            })
            .collect()
    } else {
        let priority =
            DevicePriority::parse(spec).map_err(|e| CoordinatorError::Devices(e.to_string()))?;
        let mut out = Vec::new();
        for d in priority.devices {
            if let Some(host) = &d.host {
                // A copy restricted to some workers keeps only theirs.
                if only.is_none_or(|hosts| hosts.contains(host)) {
                    out.push(d);
                }
                continue;
            }
            let matching: Vec<DeviceId> = workers
                .iter()
                .filter(|w| w.devices.iter().any(|x| x.device == d.name))
                .map(|w| DeviceId {
                    host: Some(w.name.clone()),
                    ..d.clone()
                })
                .collect();
            if matching.is_empty() {
                return Err(CoordinatorError::Devices(format!(
                    "no worker has a {} device; the cluster has: {}",
                    d.name,
                    known()
                )));
            }
            out.extend(matching);
        }
        out
    };
    if wanted.is_empty() {
        return Err(CoordinatorError::Devices(format!(
            "none of the devices '{spec}' names is on its workers ({})",
            workers
                .iter()
                .map(|w| w.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    wanted
        .into_iter()
        .map(|d| {
            let host = d.host.clone().unwrap_or_default();
            let worker = workers
                .iter()
                .find(|w| w.name == host && w.devices.iter().any(|x| x.device == d.name))
                .cloned()
                .ok_or_else(|| {
                    CoordinatorError::Devices(format!(
                        "no device {d} in the cluster; it has: {}",
                        known()
                    ))
                })?;
            Ok((d, worker))
        })
        .collect()
}
