//! A subgraph's plan for one set of input shapes: its buffers, its kernel
//! launches, where its outputs are read back, and the timestamps around
//! each launch where counters are asked for.

use tessera_common::onnx::ElemType;

use super::builder::{elem_size, Step};
use super::context::Gpu;
use crate::plugin::PluginError;

/// A subgraph's plan for one set of input shapes.
pub struct Plan {
    pub(super) buffers: Vec<wgpu::Buffer>,
    pub(super) steps: Vec<Step>,
    pub(super) inputs: Vec<usize>,
    pub(super) outputs: Vec<Output>,
    /// Timestamps around every launch, where counters are asked for and
    /// the adapter can write them inside a pass.
    pub(super) timing: Option<Timing>,
}

/// A subgraph output: its buffer slot, shape, element type and the buffer
/// the host reads it from.
pub(super) struct Output {
    pub(super) slot: usize,
    pub(super) shape: Vec<usize>,
    pub(super) elem: ElemType,
    pub(super) staging: wgpu::Buffer,
}

impl Output {
    pub(super) fn bytes(&self) -> u64 {
        (self.shape.iter().product::<usize>() * elem_size(self.elem)) as u64
    }
}

/// A query set of one timestamp before each launch and one after the last,
/// resolved into a buffer the host reads.
pub(super) struct Timing {
    pub(super) set: wgpu::QuerySet,
    pub(super) resolved: wgpu::Buffer,
    pub(super) staging: wgpu::Buffer,
    pub(super) count: u32,
}

impl Timing {
    pub(super) fn new(gpu: &Gpu, launches: usize) -> Option<Timing> {
        let count = u32::try_from(launches + 1).ok()?;
        if !gpu.timestamps || count > wgpu::QUERY_SET_MAX_QUERIES {
            return None;
        }
        let bytes = u64::from(count) * u64::from(wgpu::QUERY_SIZE);
        Some(Timing {
            set: gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("launch timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count,
            }),
            resolved: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            staging: gpu.staging(bytes),
            count,
        })
    }

    /// Nanoseconds of each launch (between its timestamp and the next).
    pub(super) fn launch_ns(&self, gpu: &Gpu) -> Result<Vec<f64>, PluginError> {
        let raw = gpu.read(&self.staging, u64::from(self.count) * 8)?;
        let ticks: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        let period = f64::from(gpu.queue.get_timestamp_period());
        Ok(ticks
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]) as f64 * period)
            .collect())
    }
}
