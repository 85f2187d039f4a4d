//! A compiled subgraph on the GPU. Its nodes are planned per set of input
//! shapes (a plan: every tensor's shape, one buffer per tensor (views share
//! their source's), one dispatch per kernel launch, bind groups and
//! parameters made once); plans are cached and their buffers reused by
//! every request of those shapes. Tensors stay in GPU memory between the
//! nodes; only the subgraph's inputs and outputs cross to the host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tessera_common::declined::Declined;
use tessera_common::onnx::proto::{ModelProto, NodeProto};
use tessera_common::onnx::ElemType;
use tessera_common::tensor::Tensor;

use super::builder::{elem_size, Builder};
use super::context::Gpu;
use super::ops;
use super::plan::{Output, Plan, Timing};
use crate::plugin::{ExecStatus, InferResult, PerfCounter, PluginError, TensorSpec};

/// Plans kept per subgraph (one per distinct set of input shapes).
const MAX_PLANS: usize = 16;

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
