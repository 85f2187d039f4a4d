//! Planning a subgraph's nodes on the GPU: the [`Builder`] each op plans
//! with (tensors' shapes, element types and buffer slots, constants
//! uploaded on first use) and the kernel launches ([`Step`]s) it records.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_common::declined::{refused, unknown, unsupported, Declined};
use tessera_common::onnx::ElemType;
use tessera_common::tensor::Tensor;

use super::context::Gpu;

/// One kernel launch.
pub struct Step {
    pub pipeline: Arc<wgpu::ComputePipeline>,
    pub bind_group: wgpu::BindGroup,
    pub groups: (u32, u32, u32),
    /// The node it belongs to (for per-node counters).
    pub node: usize,
}

/// What planning a node may use.
pub struct Builder<'a> {
    pub gpu: &'a Gpu,
    pub opset: i64,
    consts: &'a HashMap<String, Tensor>,
    pub(super) buffers: Vec<wgpu::Buffer>,
    slots: HashMap<String, usize>,
    shapes: HashMap<String, Vec<usize>>,
    pub(super) steps: Vec<Step>,
    pub(super) node: usize,
    /// Element type of every tensor with a buffer (float or float16).
    elems: HashMap<String, ElemType>,
    /// How the node being planned stores its outputs (float or float16):
    /// its kernels run in that variant.
    pub elem: ElemType,
}

/// Bytes per element of a float or float16 tensor.
pub(super) fn elem_size(elem: ElemType) -> usize {
    if elem == ElemType::FLOAT16 {
        2
    } else {
        4
    }
}

impl<'a> Builder<'a> {
    pub(super) fn new(
        gpu: &'a Gpu,
        opset: i64,
        consts: &'a HashMap<String, Tensor>,
    ) -> Builder<'a> {
        Builder {
            gpu,
            opset,
            consts,
            buffers: Vec::new(),
            slots: HashMap::new(),
            shapes: HashMap::new(),
            steps: Vec::new(),
            node: 0,
            elems: HashMap::new(),
            elem: ElemType::FLOAT,
        }
    }

    /// The element type of tensor `name`, where known.
    pub fn elem_of(&self, name: &str) -> Option<ElemType> {
        self.elems
            .get(name)
            .copied()
            .or_else(|| self.consts.get(name).map(|t| t.elem()))
    }

    /// The shape of tensor `name`.
    pub fn shape(&self, name: &str) -> Result<Vec<usize>, Declined> {
        if let Some(s) = self.shapes.get(name) {
            return Ok(s.clone());
        }
        self.consts
            .get(name)
            .map(|t| t.shape().to_vec())
            .ok_or_else(|| unknown(format!("tensor '{name}' is unknown")))
    }

    /// The values of a constant integer input.
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.consts.get(name)?.int_values()
    }

    /// The values of a constant float or float16 input, as f32.
    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.consts.get(name)?.float_values()
    }

    /// The buffer slot of tensor `name` (constants uploaded on first use).
    pub fn slot(&mut self, name: &str) -> Result<usize, Declined> {
        if let Some(&s) = self.slots.get(name) {
            return Ok(s);
        }
        let t = self
            .consts
            .get(name)
            .ok_or_else(|| unknown(format!("tensor '{name}' has no buffer")))?;
        if t.elem() != ElemType::FLOAT && t.elem() != ElemType::FLOAT16 {
            return Err(unsupported(format!(
                "'{name}' is {}, not float",
                t.elem().name()
            )));
        }
        let buffer = self.gpu.buffer_with(t.bytes());
        self.elems.insert(name.into(), t.elem());
        Ok(self.add(name, buffer, t.shape().to_vec()))
    }

    fn add(&mut self, name: &str, buffer: wgpu::Buffer, shape: Vec<usize>) -> usize {
        self.buffers.push(buffer);
        let slot = self.buffers.len() - 1;
        self.slots.insert(name.into(), slot);
        self.shapes.insert(name.into(), shape);
        slot
    }

    /// A new buffer for output `name` of `shape`, stored as `self.elem`.
    pub fn output(&mut self, name: &str, shape: Vec<usize>) -> Result<usize, Declined> {
        let bytes = shape.iter().product::<usize>() * elem_size(self.elem);
        if bytes as u64 > self.gpu.max_binding {
            return Err(unsupported(format!(
                "'{name}' ({} MB) exceeds the device's largest storage binding",
                bytes >> 20
            )));
        }
        let buffer = self.gpu.buffer(bytes);
        self.elems.insert(name.into(), self.elem);
        Ok(self.add(name, buffer, shape))
    }

    /// Output `name` is a view of input `from` with another shape.
    pub fn alias(&mut self, name: &str, from: &str, shape: Vec<usize>) -> Result<(), Declined> {
        let slot = self.slot(from)?;
        if let Some(elem) = self.elem_of(from) {
            self.elems.insert(name.into(), elem);
        }
        self.slots.insert(name.into(), slot);
        self.shapes.insert(name.into(), shape);
        Ok(())
    }

    /// One launch of `kernel` over `slots` (its bindings in order, the
    /// parameters last) with `groups` workgroups.
    pub fn dispatch(
        &mut self,
        kernel: &str,
        slots: &[usize],
        params: &[u32],
        groups: (u32, u32, u32),
    ) -> Result<(), Declined> {
        let pipeline = self
            .gpu
            .pipeline(kernel, self.elem == ElemType::FLOAT16)
            .map_err(refused)?;
        let params = self.gpu.buffer_with(bytemuck::cast_slice(params));
        let layout = pipeline.get_bind_group_layout(0);
        let mut entries: Vec<wgpu::BindGroupEntry> = slots
            .iter()
            .enumerate()
            .map(|(i, &s)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: self.buffers[s].as_entire_binding(),
            })
            .collect();
        entries.push(wgpu::BindGroupEntry {
            binding: slots.len() as u32,
            resource: params.as_entire_binding(),
        });
        let bind_group = self
            .gpu
            .scoped(kernel, || {
                self.gpu
                    .device
                    .create_bind_group(&wgpu::BindGroupDescriptor {
                        label: Some(kernel),
                        layout: &layout,
                        entries: &entries,
                    })
            })
            .map_err(refused)?;
        self.steps.push(Step {
            pipeline,
            bind_group,
            groups,
            node: self.node,
        });
        Ok(())
    }
}

/// Workgroups of 256 for `n` elements (the kernels loop over the rest).
pub fn groups_1d(n: usize) -> (u32, u32, u32) {
    (n.div_ceil(256).clamp(1, 65535) as u32, 1, 1)
}
