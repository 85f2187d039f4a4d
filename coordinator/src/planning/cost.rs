//! The cost model planning predicts with: the devices' reported figures
//! and the links the coordinator measures to each worker.

use std::sync::Arc;

use tessera_common::affinity::{AnalyticCostModel, DeviceId, DeviceProfile, LinkProfile};

use crate::workers::WorkerEntry;
use crate::Shared;

/// The cost model: each device's reported figures; between hosts, the
/// round-trip time and bandwidth the coordinator measures (each worker's
/// own link: half its round trip, its measured bandwidth).
pub(super) fn cost_model(
    shared: &Shared,
    devices: &[(DeviceId, Arc<WorkerEntry>)],
) -> AnalyticCostModel {
    let mut model = AnalyticCostModel::default();
    let mut rtt_us = Vec::new();
    let mut gbps = Vec::new();
    for (id, worker) in devices {
        gbps.extend(worker.bandwidth_gbps());
        if let Some(info) = worker.devices.iter().find(|d| d.device == id.name) {
            if info.gflops > 0.0 && info.bandwidth_gbps > 0.0 {
                let launch_us = model.kinds.get(&id.name).map_or(5.0, |p| p.launch_us);
                model.devices.insert(
                    id.clone(),
                    DeviceProfile {
                        gflops: info.gflops,
                        mem_gbps: info.bandwidth_gbps,
                        launch_us,
                    },
                );
            }
        }
        let rtt = worker.rtt().as_secs_f64() * 1e6;
        rtt_us.push(rtt);
        let link = LinkProfile {
            gbps: worker
                .bandwidth_gbps()
                .unwrap_or(shared.config.inter_host_gbps),
            latency_us: rtt / 2.0,
        };
        model.host_links.insert(worker.name.clone(), link);
    }
    if !rtt_us.is_empty() {
        let mean = rtt_us.iter().sum::<f64>() / rtt_us.len() as f64;
        // Measured bandwidth where known; the configured one otherwise.
        let bandwidth = if gbps.is_empty() {
            shared.config.inter_host_gbps
        } else {
            gbps.iter().sum::<f64>() / gbps.len() as f64
        };
        model.inter_host = LinkProfile {
            gbps: bandwidth,
            latency_us: mean,
        };
    }
    model
}
