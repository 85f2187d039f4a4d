//! The plugin registry: every backend this build knows, by device name.
//! Each backend sits behind a cargo feature; asking for one that was not
//! built says so.

#[cfg(feature = "cpu")]
pub mod cpu;
#[cfg(feature = "gpu")]
pub mod gpu;

use std::sync::Arc;

use crate::plugin::{DevicePlugin, PluginError};

/// Device kinds this crate has backends for, and the cargo feature of each.
pub const BACKENDS: [(&str, &str); 2] = [("CPU", "cpu"), ("GPU", "gpu")];

/// Creates the plugin for a device kind (`CPU`, ...).
pub fn create(kind: &str) -> Result<Arc<dyn DevicePlugin>, PluginError> {
    match kind {
        #[cfg(feature = "cpu")]
        "CPU" => Ok(Arc::new(cpu::CpuPlugin::new()?)),
        #[cfg(feature = "gpu")]
        "GPU" => Ok(Arc::new(gpu::GpuPlugin::new()?)),
        other => {
            let reason = match BACKENDS.iter().find(|(k, _)| *k == other) {
                Some((_, feature)) => format!(
                    "this build has no {other} backend (not built with feature '{feature}')"
                ),
                None => {
                    let known: Vec<&str> = BACKENDS.iter().map(|(k, _)| *k).collect();
                    format!("unknown device kind; known: {}", known.join(", "))
                }
            };
            Err(PluginError::Unavailable {
                plugin: other.into(),
                reason,
            })
        }
    }
}
