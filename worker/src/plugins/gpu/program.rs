//! A compiled subgraph on the GPU. Its nodes are planned per set of input
//! shapes (a plan: every tensor's shape, one buffer per tensor (views share
//! their source's), one dispatch per kernel launch, bind groups and
//! parameters made once); plans are cached and their buffers reused by
//! every request of those shapes. Tensors stay in GPU memory between the
//! nodes; only the subgraph's inputs and outputs cross to the host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tessera_common::declined::{refused, unknown, unsupported, Declined};
use tessera_common::onnx::proto::{ModelProto, NodeProto};
use tessera_common::onnx::ElemType;
use tessera_common::tensor::Tensor;

use super::context::Gpu;
use super::ops;
use crate::plugin::{ExecStatus, InferResult, PerfCounter, PluginError, TensorSpec};

/// Plans kept per subgraph (one per distinct set of input shapes).
const MAX_PLANS: usize = 16;

/// One kernel launch.
pub struct Step {
    pub pipeline: Arc<wgpu::ComputePipeline>,
    pub bind_group: wgpu::BindGroup,
    pub groups: (u32, u32, u32),
    /// The node it belongs to (for per-node counters).
    pub node: usize,
}

/// A subgraph's plan for one set of input shapes.
pub struct Plan {
    buffers: Vec<wgpu::Buffer>,
    steps: Vec<Step>,
    inputs: Vec<usize>,
    outputs: Vec<Output>,
    /// Timestamps around every launch, where counters are asked for and
    /// the adapter can write them inside a pass.
    timing: Option<Timing>,
}

/// A subgraph output: its buffer slot, shape, element type and the buffer
/// the host reads it from.
struct Output {
    slot: usize,
    shape: Vec<usize>,
    elem: ElemType,
    staging: wgpu::Buffer,
}

impl Output {
    fn bytes(&self) -> u64 {
        (self.shape.iter().product::<usize>() * elem_size(self.elem)) as u64
    }
}

/// A query set of one timestamp before each launch and one after the last,
/// resolved into a buffer the host reads.
struct Timing {
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    staging: wgpu::Buffer,
    count: u32,
}

impl Timing {
    fn new(gpu: &Gpu, launches: usize) -> Option<Timing> {
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
    fn launch_ns(&self, gpu: &Gpu) -> Result<Vec<f64>, PluginError> {
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

/// What planning a node may use.
pub struct Builder<'a> {
    pub gpu: &'a Gpu,
    pub opset: i64,
    consts: &'a HashMap<String, Tensor>,
    buffers: Vec<wgpu::Buffer>,
    slots: HashMap<String, usize>,
    shapes: HashMap<String, Vec<usize>>,
    steps: Vec<Step>,
    node: usize,
    /// Element type of every tensor with a buffer (float or float16).
    elems: HashMap<String, ElemType>,
    /// How the node being planned stores its outputs (float or float16):
    /// its kernels run in that variant.
    pub elem: ElemType,
}

/// Bytes per element of a float or float16 tensor.
fn elem_size(elem: ElemType) -> usize {
    if elem == ElemType::FLOAT16 {
        2
    } else {
        4
    }
}

impl<'a> Builder<'a> {
    fn new(gpu: &'a Gpu, opset: i64, consts: &'a HashMap<String, Tensor>) -> Builder<'a> {
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

/// The shapes of a request's inputs (a plan's key).
type InputShapes = Vec<Vec<usize>>;

/// A subgraph compiled for the GPU.
pub struct Program {
    gpu: Arc<Gpu>,
    nodes: Vec<NodeProto>,
    consts: HashMap<String, Tensor>,
    opset: i64,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    perf: bool,
    plans: Mutex<Vec<(InputShapes, Arc<Mutex<Plan>>)>>,
    /// The ONNX subgraph it was compiled from (what `export` keeps).
    pub onnx: bytes::Bytes,
}

fn bad(m: String) -> PluginError {
    PluginError::InvalidModel(m)
}

impl Program {
    pub fn new(
        gpu: Arc<Gpu>,
        model: &ModelProto,
        onnx: bytes::Bytes,
        perf: bool,
    ) -> Result<Program, PluginError> {
        let graph = model
            .graph
            .as_ref()
            .ok_or_else(|| bad("the model has no graph".into()))?;
        let opset = ops::opset(model);
        let mut consts = HashMap::new();
        for init in &graph.initializer {
            let t = Tensor::from_proto(init).map_err(|e| bad(format!("{}: {e}", init.name())))?;
            consts.insert(init.name().to_string(), t);
        }
        let mut nodes = Vec::new();
        for node in &graph.node {
            if node.op_type() == "Constant" && node.input.is_empty() {
                let t = ops::constant_value(node).map_err(|e| bad(e.to_string()))?;
                consts.insert(node.output.first().cloned().unwrap_or_default(), t);
                continue;
            }
            ops::check(node, opset).map_err(|e| {
                super::context::compile_error(format!("{} ({}): {e}", node.name(), node.op_type()))
            })?;
            nodes.push(node.clone());
        }
        // Every kernel the subgraph needs, compiled now (and their f16
        // variants where it stores float16 tensors).
        let half = consts.values().any(|t| t.elem() == ElemType::FLOAT16)
            || graph
                .input
                .iter()
                .any(|i| ops::value_type(i).0 == ElemType::FLOAT16);
        for node in &nodes {
            for kernel in ops::kernels(node.op_type()) {
                gpu.pipeline(kernel, false)?;
                if half {
                    gpu.pipeline(kernel, true)?;
                }
            }
        }
        let spec = |v: &tessera_common::onnx::proto::ValueInfoProto| -> TensorSpec {
            TensorSpec::from_value_info(v).unwrap_or_else(|| TensorSpec {
                name: v.name().to_string(),
                elem: ElemType::UNDEFINED,
                shape: None,
                kind: crate::plugin::ValueKind::Tensor,
            })
        };
        let inputs: Vec<TensorSpec> = graph
            .input
            .iter()
            .filter(|i| !consts.contains_key(i.name()))
            .map(spec)
            .collect();
        if let Some(other) = inputs
            .iter()
            .find(|i| i.elem != ElemType::FLOAT && i.elem != ElemType::FLOAT16)
        {
            return Err(bad(format!(
                "input '{}' is {}: the GPU plugin takes float and float16 tensors",
                other.name,
                other.elem.name()
            )));
        }
        let outputs = graph.output.iter().map(spec).collect();
        Ok(Program {
            gpu,
            nodes,
            consts,
            opset,
            inputs,
            outputs,
            perf,
            plans: Mutex::new(Vec::new()),
            onnx,
        })
    }

    /// The plan for these input shapes (made on first use).
    fn plan(&self, shapes: Vec<Vec<usize>>) -> Result<Arc<Mutex<Plan>>, PluginError> {
        let poisoned = |_| PluginError::Infer("GPU plan cache poisoned".into());
        if let Some((_, p)) = self
            .plans
            .lock()
            .map_err(poisoned)?
            .iter()
            .find(|(s, _)| *s == shapes)
        {
            return Ok(p.clone());
        }
        let mut b = Builder::new(&self.gpu, self.opset, &self.consts);
        let mut inputs = Vec::new();
        for (spec, shape) in self.inputs.iter().zip(&shapes) {
            b.elem = spec.elem;
            inputs.push(
                b.output(&spec.name, shape.clone())
                    .map_err(|e| PluginError::BadInput(e.to_string()))?,
            );
        }
        for (i, node) in self.nodes.iter().enumerate() {
            b.node = i;
            let failed = |e: Declined| {
                PluginError::Infer(format!("{} ({}): {e}", node.name(), node.op_type()))
            };
            b.elem = ops::storage(&b, node).map_err(failed)?;
            ops::plan(&mut b, node).map_err(failed)?;
        }
        let mut outputs = Vec::new();
        for spec in &self.outputs {
            let infer = |e: Declined| PluginError::Infer(e.to_string());
            let slot = b.slot(&spec.name).map_err(infer)?;
            let shape = b.shape(&spec.name).map_err(infer)?;
            let elem = b.elem_of(&spec.name).unwrap_or(ElemType::FLOAT);
            let bytes = (shape.iter().product::<usize>() * elem_size(elem)) as u64;
            outputs.push(Output {
                slot,
                shape,
                elem,
                staging: self.gpu.staging(bytes),
            });
        }
        let timing = if self.perf {
            Timing::new(&self.gpu, b.steps.len())
        } else {
            None
        };
        let plan = Arc::new(Mutex::new(Plan {
            buffers: b.buffers,
            steps: b.steps,
            inputs,
            outputs,
            timing,
        }));
        let mut plans = self.plans.lock().map_err(poisoned)?;
        if plans.len() >= MAX_PLANS {
            plans.remove(0);
        }
        plans.push((shapes, plan.clone()));
        Ok(plan)
    }

    pub fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    pub fn infer(&self, inputs: &[Tensor]) -> Result<InferResult, PluginError> {
        if inputs.len() != self.inputs.len() {
            return Err(PluginError::BadInput(format!(
                "expected {} inputs, got {}",
                self.inputs.len(),
                inputs.len()
            )));
        }
        for (t, spec) in inputs.iter().zip(&self.inputs) {
            spec.check(t)?;
        }
        let plan = self.plan(inputs.iter().map(|t| t.shape().to_vec()).collect())?;
        let plan = plan
            .lock()
            .map_err(|_| PluginError::Infer("GPU plan poisoned".into()))?;
        let started = Instant::now();
        for (t, &slot) in inputs.iter().zip(&plan.inputs) {
            let bytes = t.bytes();
            if bytes.len() % 4 != 0 {
                // Writes are whole words (an odd number of f16).
                let mut padded = bytes.to_vec();
                padded.resize(bytes.len().next_multiple_of(4), 0);
                self.gpu.queue.write_buffer(&plan.buffers[slot], 0, &padded);
            } else if !bytes.is_empty() {
                self.gpu.queue.write_buffer(&plan.buffers[slot], 0, bytes);
            }
        }
        let mut encoder = self
            .gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for (i, step) in plan.steps.iter().enumerate() {
                if let Some(t) = &plan.timing {
                    pass.write_timestamp(&t.set, i as u32);
                }
                pass.set_pipeline(&step.pipeline);
                pass.set_bind_group(0, &step.bind_group, &[]);
                pass.dispatch_workgroups(step.groups.0, step.groups.1, step.groups.2);
            }
            if let Some(t) = &plan.timing {
                pass.write_timestamp(&t.set, t.count - 1);
            }
        }
        if let Some(t) = &plan.timing {
            encoder.resolve_query_set(&t.set, 0..t.count, &t.resolved, 0);
            encoder.copy_buffer_to_buffer(&t.resolved, 0, &t.staging, 0, u64::from(t.count) * 8);
        }
        for out in &plan.outputs {
            if out.bytes() > 0 {
                let words = out.bytes().next_multiple_of(4);
                encoder.copy_buffer_to_buffer(&plan.buffers[out.slot], 0, &out.staging, 0, words);
            }
        }
        self.gpu.queue.submit([encoder.finish()]);
        let mut outputs = Vec::with_capacity(plan.outputs.len());
        for out in &plan.outputs {
            let data = if out.bytes() > 0 {
                self.gpu.read(&out.staging, out.bytes())?
            } else {
                Vec::new()
            };
            outputs.push(
                Tensor::new(out.elem, out.shape.clone(), data)
                    .map_err(|e| PluginError::Infer(e.to_string()))?,
            );
        }
        let counters = if self.perf {
            self.counters(&plan, started.elapsed().as_micros() as u64)?
        } else {
            Vec::new()
        };
        Ok(InferResult { outputs, counters })
    }

    /// Per-node counters: each node's launches timed on the GPU where the
    /// plan has timestamps, else the request's `total_us` shared by the
    /// nodes by their number of launches.
    fn counters(&self, plan: &Plan, total_us: u64) -> Result<Vec<PerfCounter>, PluginError> {
        let launch_ns = match &plan.timing {
            Some(t) => Some(t.launch_ns(&self.gpu)?),
            None => None,
        };
        let launches = plan.steps.len().max(1) as u64;
        Ok(self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let own: Vec<usize> = (0..plan.steps.len())
                    .filter(|&s| plan.steps[s].node == i)
                    .collect();
                let real_us = match &launch_ns {
                    Some(ns) => (own.iter().map(|&s| ns[s]).sum::<f64>() / 1e3).round() as u64,
                    None => total_us * own.len() as u64 / launches,
                };
                PerfCounter {
                    node: n.name().to_string(),
                    op_type: n.op_type().to_string(),
                    status: if own.is_empty() {
                        ExecStatus::OptimizedOut
                    } else {
                        ExecStatus::Executed
                    },
                    real_us,
                    cpu_us: 0,
                    exec_type: if launch_ns.is_some() {
                        "wgpu_f32 (GPU timestamps)".into()
                    } else {
                        "wgpu_f32".into()
                    },
                }
            })
            .collect())
    }
}

/// Measures (GFLOPS, GB/s) on `gpu`: a 512³ GEMM and a 64 MB copy, each
/// run a few times after a warm-up.
pub fn calibrate(gpu: &Gpu) -> Result<(f64, f64), PluginError> {
    let consts = HashMap::new();
    let mut b = Builder::new(gpu, 17, &consts);
    let err = |e: Declined| PluginError::Infer(e.to_string());
    let n = 512usize;
    let a = b.output("a", vec![n, n]).map_err(err)?;
    let w = b.output("w", vec![n, n]).map_err(err)?;
    let y = b.output("y", vec![n, n]).map_err(err)?;
    let mut p = vec![
        n as u32,
        n as u32,
        n as u32,
        0,
        0,
        1f32.to_bits(),
        0,
        0,
        0,
        0,
        0,
    ];
    p.extend([1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    let groups = (n.div_ceil(64) as u32, n.div_ceil(64) as u32, 1);
    b.dispatch("gemm", &[a, w, w, y], &p, groups).map_err(err)?;
    let words = 16usize << 20;
    let src = b.output("src", vec![words]).map_err(err)?;
    let dst = b.output("dst", vec![words]).map_err(err)?;
    let mut c = vec![words as u32, 1, 0, 0];
    c.extend([
        words as u32,
        1,
        1,
        1,
        1,
        1,
        1,
        0,
        0,
        0,
        0,
        0,
        1,
        0,
        0,
        0,
        0,
        0,
    ]);
    b.dispatch("copy", &[src, dst], &c, groups_1d(words))
        .map_err(err)?;
    let time = |step: &Step| -> Result<f64, PluginError> {
        let mut best = f64::MAX;
        for _ in 0..4 {
            let started = Instant::now();
            let mut encoder = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                pass.set_pipeline(&step.pipeline);
                pass.set_bind_group(0, &step.bind_group, &[]);
                pass.dispatch_workgroups(step.groups.0, step.groups.1, step.groups.2);
            }
            gpu.queue.submit([encoder.finish()]);
            gpu.wait()?;
            best = best.min(started.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let gemm = time(&b.steps[0])?;
    let copy = time(&b.steps[1])?;
    let gflops = 2.0 * (n * n * n) as f64 / gemm / 1e9;
    let gbps = 2.0 * (words * 4) as f64 / copy / 1e9;
    Ok((gflops, gbps))
}
