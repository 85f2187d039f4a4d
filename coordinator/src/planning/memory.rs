//! Memory accounting for planning: what the deployed networks need on
//! each device, and what each device may still take.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_common::affinity::DeviceId;

use crate::workers::WorkerEntry;
use crate::Shared;

/// What the networks deployed now need on each device (`host/DEVICE`),
/// but network `except`'s (being planned again), bytes.
fn memory_in_use(shared: &Shared, except: Option<u64>) -> HashMap<String, u64> {
    memory_needs(shared, except)
        .into_iter()
        .map(|(device, need)| (device, need.total()))
        .collect()
}

/// [`memory_in_use`] as weights, activations and state.
pub(crate) fn memory_needs(
    shared: &Shared,
    except: Option<u64>,
) -> HashMap<String, tessera_common::memory::MemoryNeed> {
    let mut used: HashMap<String, tessera_common::memory::MemoryNeed> = HashMap::new();
    for loaded in shared.networks.iter() {
        if Some(loaded.id) == except {
            continue;
        }
        for deployed in loaded.deployments() {
            for d in &deployed.plan.memory.devices {
                *used.entry(d.device.clone()).or_default() += d.need;
            }
        }
    }
    used
}

/// What each device may still take: what it offers (its worker's limit,
/// else what it has) less what deployed networks other than `except`
/// need there. Devices that report nothing are not limited.
pub(super) fn free_memory(
    shared: &Shared,
    devices: &[(DeviceId, Arc<WorkerEntry>)],
    except: Option<u64>,
) -> HashMap<DeviceId, u64> {
    let used = memory_in_use(shared, except);
    devices
        .iter()
        .filter_map(|(id, w)| {
            let info = w.devices.iter().find(|d| d.device == id.name)?;
            let taken = used.get(&id.to_string()).copied().unwrap_or(0);
            (info.memory_bytes > 0).then(|| (id.clone(), info.memory_bytes.saturating_sub(taken)))
        })
        .collect()
}
