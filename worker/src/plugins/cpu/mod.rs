//! The CPU plugin, on tract-onnx.
//!
//! Compiles an ONNX subgraph with `with_ignore_value_info(true)` and the
//! declared input types, optimizes it and runs requests on a plan that is
//! shared by concurrent requests (each request has its own state).
//! QueryNetwork is honest: a node is supported only if tract builds and
//! types it (see `query`), and ops tract is known to get wrong are refused.

mod query;
mod tract;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use tessera_common::onnx::decode_model_shared;
use tessera_common::onnx::proto::ModelProto;
use tessera_common::tensor::Tensor;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::plan::{SimplePlan, SimpleState};
use tract_onnx::tract_core::runtime::RunOptions;

use crate::plugin::{
    blob, CompiledSubgraph, Config, DevicePlugin, ExecStatus, InferResult, MetricValue,
    PerfCounter, PluginError, QueryResult, TensorSpec,
};

const BACKEND: &str = "tract-onnx";
const BACKEND_VERSION: &str = "0.23";
/// Specialized plans kept per compiled subgraph.
const MAX_PLANS: usize = 32;

/// The CPU plugin.
pub struct CpuPlugin {
    name: String,
    config: Mutex<Config>,
    probes: crate::plugins::probe::ProbeCache,
}

impl CpuPlugin {
    /// The CPU plugin, named `CPU`.
    pub fn new() -> Result<CpuPlugin, PluginError> {
        CpuPlugin::named("CPU")
    }

    /// A CPU plugin under another device name (a second real instance, e.g.
    /// to exercise HETERO on one machine).
    pub fn named(name: &str) -> Result<CpuPlugin, PluginError> {
        if std::thread::available_parallelism().is_err() {
            return Err(PluginError::Unavailable {
                plugin: name.into(),
                reason: "cannot query the CPU count".into(),
            });
        }
        Ok(CpuPlugin {
            name: name.to_string(),
            config: Mutex::new(Config::default()),
            probes: crate::plugins::probe::ProbeCache::default(),
        })
    }

    /// GFLOP/s of a 256³ f32 MatMul through tract, and memory bandwidth
    /// (GB/s) of a 64 MiB copy; measured once per process (every instance
    /// runs on the same machine: an embedded cluster's workers share it).
    fn calibrate(&self) -> (f64, f64) {
        static CALIBRATION: OnceLock<(f64, f64)> = OnceLock::new();
        *CALIBRATION.get_or_init(|| crate::plugins::remembered_calibration("tract", measure))
    }
}

/// GFLOP/s of a 256³ f32 MatMul through tract, and memory bandwidth.
fn measure() -> (f64, f64) {
    let n = 256usize;
    let gflops = (|| -> TractResult<f64> {
        let mut model = TypedModel::default();
        let a = model.add_source("a", f32::fact([n, n]))?;
        let b = model.add_const("b", tract_onnx::prelude::Tensor::zero::<f32>(&[n, n])?)?;
        let c = model.wire_node(
            "mm",
            tract_onnx::tract_core::ops::einsum::EinSum::new(
                "mk,kn->mn".parse()?,
                f32::datum_type(),
            ),
            &[a, b],
        )?;
        model.select_output_outlets(&c)?;
        let plan = model.into_optimized()?.into_runnable()?;
        let input: TValue = tract_onnx::prelude::Tensor::zero::<f32>(&[n, n])?.into();
        plan.run(tvec![input.clone()])?;
        crate::plugins::fastest_gflops(2.0 * (n * n * n) as f64, 8, || {
            plan.run(tvec![input.clone()]).map(drop)
        })
    })()
    .unwrap_or(0.0);
    (gflops, crate::plugins::memory_bandwidth_gbps())
}

impl DevicePlugin for CpuPlugin {
    fn name(&self) -> &str {
        &self.name
    }

    fn available_devices(&self) -> Vec<String> {
        vec![format!("{}.0", self.name)]
    }

    fn metric(&self, name: &str) -> Result<MetricValue, PluginError> {
        let backend = format!("tract-onnx {BACKEND_VERSION}");
        let threads = crate::plugins::configured_threads(&self.config());
        crate::plugins::cpu_metric(&self.name, &backend, name, || {
            let (gflops, gbps) = self.calibrate();
            (gflops * threads, gbps)
        })
    }

    fn set_config(&self, key: &str, value: &str) -> Result<(), PluginError> {
        let mut config = self
            .config
            .lock()
            .map_err(|_| PluginError::Infer("config lock poisoned".into()))?;
        config.set(key, value)
    }

    fn config(&self) -> Config {
        self.config.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn query_network(&self, model: &ModelProto) -> Result<QueryResult, PluginError> {
        query::query_network(model, &self.probes)
    }

    fn compile(
        &self,
        onnx: &Bytes,
        config: &Config,
    ) -> Result<Arc<dyn CompiledSubgraph>, PluginError> {
        let config = self.config().merged(config);
        Ok(Arc::new(CompiledCpu::new(&self.name, onnx, config)?))
    }

    fn import(&self, blob: &Bytes) -> Result<Arc<dyn CompiledSubgraph>, PluginError> {
        let (config, payload) = blob::read(blob, &self.name, BACKEND, BACKEND_VERSION)?;
        // tract has no serialized plan: importing re-optimizes the embedded model.
        Ok(Arc::new(CompiledCpu::new(&self.name, &payload, config)?))
    }
}

type Plan = Arc<SimplePlan<TypedFact, Box<dyn TypedOp>>>;
/// Input shapes, with the bytes of small integer inputs.
type PlanKey = Vec<(Vec<usize>, Vec<u8>)>;

/// A subgraph compiled by tract. Requests run on a plan specialized for
/// their input shapes (and the values of small integer inputs such as
/// shapes), built on first use and cached: tract optimizes concrete shapes
/// best, and some models (a Reshape fed by the Shape of a dynamic batch)
/// type only with them. `compile` checks the model with symbolic dims.
pub struct CompiledCpu {
    device: String,
    /// The subgraph as compiled (exported as it is).
    onnx: Bytes,
    /// What tract builds: `onnx` with the ops tract lacks decomposed.
    tract_onnx: Bytes,
    config: Config,
    /// Plans by concrete input shapes (and values of small integer inputs).
    by_shape: Mutex<HashMap<PlanKey, Plan>>,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    /// Original ONNX nodes (name, op type), for performance counters.
    nodes: Vec<(String, String)>,
}

fn poisoned() -> PluginError {
    PluginError::Infer("plan cache lock poisoned".into())
}

fn concrete(shapes: &[Vec<usize>]) -> Vec<Vec<Option<usize>>> {
    shapes
        .iter()
        .map(|s| s.iter().map(|&d| Some(d)).collect())
        .collect()
}

fn specs(
    values: &[tessera_common::onnx::proto::ValueInfoProto],
    skip: &[&str],
) -> Result<Vec<TensorSpec>, PluginError> {
    values
        .iter()
        .filter(|v| !skip.contains(&v.name.as_deref().unwrap_or("")))
        .map(|v| {
            TensorSpec::from_value_info(v).ok_or_else(|| {
                PluginError::InvalidModel(format!(
                    "'{}' is not a tensor of a known element type",
                    v.name.as_deref().unwrap_or("")
                ))
            })
        })
        .collect()
}

impl CompiledCpu {
    fn new(device: &str, onnx: &Bytes, config: Config) -> Result<CompiledCpu, PluginError> {
        let model = decode_model_shared(onnx.clone())
            .map_err(|e| PluginError::InvalidModel(e.to_string()))?;
        let graph = model
            .graph
            .as_ref()
            .ok_or_else(|| PluginError::InvalidModel("no graph".into()))?;
        let inits: Vec<&str> = graph
            .initializer
            .iter()
            .filter_map(|t| t.name.as_deref())
            .collect();
        let inputs = specs(&graph.input, &inits)?;
        let outputs: Vec<TensorSpec> = specs(&graph.output, &[]).unwrap_or_default();
        let nodes = graph
            .node
            .iter()
            .map(|n| {
                (
                    n.name.clone().unwrap_or_default(),
                    n.op_type.clone().unwrap_or_default(),
                )
            })
            .collect();
        let tract_onnx = match query::for_tract(&model)? {
            Some(decomposed) => Bytes::from(tessera_common::onnx::encode_model(&decomposed)),
            None => onnx.clone(),
        };
        let mut compiled = CompiledCpu {
            device: device.into(),
            onnx: onnx.clone(),
            tract_onnx,
            config,
            by_shape: Mutex::new(HashMap::new()),
            inputs,
            outputs,
            nodes,
        };
        // An input of unknown rank: plans are built per request's shapes.
        let declared: Option<Vec<Vec<Option<usize>>>> =
            compiled.inputs.iter().map(|s| s.shape.clone()).collect();
        let all_static = declared
            .as_ref()
            .is_some_and(|d| d.iter().flatten().all(Option::is_some));
        let built = match &declared {
            Some(dims) => compiled.build(dims, &[]).map(Some),
            None => Ok(None),
        };
        match built {
            // Kept for the first request if its shapes are the declared ones.
            Ok(Some(plan)) if all_static => {
                let key = declared
                    .iter()
                    .flatten()
                    .map(|s| (s.iter().flatten().copied().collect(), Vec::new()))
                    .collect();
                compiled
                    .by_shape
                    .get_mut()
                    .map_err(|_| poisoned())?
                    .insert(key, plan);
            }
            Ok(_) if declared.is_some() => {}
            Err(e) if all_static => return Err(e),
            Ok(_) | Err(_) => {
                // tract needs concrete dims for this model: plans are built
                // per input shape on first use; check now that it parses.
                tract_onnx::onnx()
                    .with_ignore_value_info(true)
                    .model_for_read(&mut &compiled.tract_onnx[..])
                    .map_err(|e| PluginError::Compile {
                        backend: BACKEND.into(),
                        reason: format!("{e:#}"),
                    })?;
            }
        }
        Ok(compiled)
    }

    /// Builds a plan for these input shapes (`None`: symbolic).
    /// `values`: inputs to treat as known values (small integer tensors
    /// such as shapes, which tract needs as constants to type a Reshape).
    fn build(
        &self,
        shapes: &[Vec<Option<usize>>],
        values: &[Option<&Tensor>],
    ) -> Result<Plan, PluginError> {
        let compile_err = |e: TractError| PluginError::Compile {
            backend: BACKEND.into(),
            reason: format!("{e:#}"),
        };
        let mut inference = tract_onnx::onnx()
            .with_ignore_value_info(true)
            .model_for_read(&mut &self.tract_onnx[..])
            .map_err(compile_err)?;
        for (i, (spec, shape)) in self.inputs.iter().zip(shapes).enumerate() {
            let dt = tract::datum_type(spec.elem).ok_or_else(|| PluginError::Compile {
                backend: BACKEND.into(),
                reason: format!("input type {} unsupported", spec.elem),
            })?;
            let dims: TVec<TDim> = shape
                .iter()
                .enumerate()
                .map(|(k, d)| match d {
                    Some(v) => TDim::Val(*v as i64),
                    None => inference.symbols.sym(&format!("in{i}_{k}")).into(),
                })
                .collect();
            let fact = match values.get(i).copied().flatten() {
                Some(v) => InferenceFact::from(tract::to_tract(v)?.into_tensor()),
                None => InferenceFact::dt_shape(dt, dims),
            };
            inference.set_input_fact(i, fact).map_err(compile_err)?;
        }
        let typed = inference.into_optimized().map_err(compile_err)?;
        let threads = self.config.num_threads().unwrap_or(1);
        let options = RunOptions {
            executor: (threads > 1)
                .then(|| tract_linalg::multithread::Executor::multithread(threads)),
            ..Default::default()
        };
        typed
            .into_runnable_with_options(&options)
            .map_err(compile_err)
    }

    /// Small integer and boolean inputs (shapes, axes, and the masks that
    /// pick among a shape's dims) are specialized by value too: a torch
    /// export's `expand` computes its target shape as
    /// `Where(Equal(shape, -1), ones, shape)`, and a cut between the
    /// `Equal` and the `Expand` leaves tract a shape of unknown rank
    /// unless the mask is a constant.
    fn specialized(&self, inputs: &[Tensor]) -> Result<Plan, PluginError> {
        let is_small_int = |t: &Tensor| matches!(t.elem().0, 6 | 7 | 9) && t.len() <= 16;
        let values: Vec<Option<&Tensor>> = inputs
            .iter()
            .map(|t| is_small_int(t).then_some(t))
            .collect();
        let key: PlanKey = inputs
            .iter()
            .map(|t| {
                (
                    t.shape().to_vec(),
                    if is_small_int(t) {
                        t.bytes().to_vec()
                    } else {
                        Vec::new()
                    },
                )
            })
            .collect();
        if let Some(plan) = self.by_shape.lock().map_err(|_| poisoned())?.get(&key) {
            return Ok(plan.clone());
        }
        tracing::debug!(shapes = ?inputs.iter().map(Tensor::shape).collect::<Vec<_>>(), "specializing a plan");
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        let plan = self.build(&concrete(&shapes), &values)?;
        let mut cache = self.by_shape.lock().map_err(|_| poisoned())?;
        if cache.len() >= MAX_PLANS {
            cache.clear();
        }
        cache.insert(key, plan.clone());
        Ok(plan)
    }

    fn run(&self, plan: &Plan, inputs: &[Tensor]) -> Result<InferResult, PluginError> {
        let values: TVec<TValue> = inputs
            .iter()
            .map(tract::to_tract)
            .collect::<Result<_, _>>()?;
        let infer_err = |e: TractError| PluginError::Infer(format!("{e:#}"));
        let (outputs, counters) = if self.config.perf_count() {
            let mut times: HashMap<String, (u64, String)> = HashMap::new();
            let mut state = SimpleState::new(plan).map_err(infer_err)?;
            let outputs = state
                .run_plan_with_eval(values, |ctx, op_state, node, input| {
                    let start = Instant::now();
                    let r = tract_onnx::tract_core::plan::eval(ctx, op_state, node, input);
                    let entry = times
                        .entry(node.name.clone())
                        .or_insert((0, node.op().name().to_string()));
                    entry.0 += start.elapsed().as_micros() as u64;
                    r
                })
                .map_err(infer_err)?;
            (outputs, self.counters(&times))
        } else {
            (plan.run(values).map_err(infer_err)?, Vec::new())
        };
        let outputs = outputs
            .into_iter()
            .map(tract::from_tract)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(InferResult { outputs, counters })
    }

    fn counters(&self, times: &HashMap<String, (u64, String)>) -> Vec<PerfCounter> {
        self.nodes
            .iter()
            .map(|(name, op)| {
                // tract names the nodes it derives from an ONNX node after it.
                let mut real = 0;
                let mut kinds = Vec::new();
                for (tract_name, (us, kind)) in times {
                    if tract_name == name
                        || tract_name
                            .strip_prefix(name.as_str())
                            .is_some_and(|r| r.starts_with('.'))
                    {
                        real += us;
                        if !kinds.contains(kind) {
                            kinds.push(kind.clone());
                        }
                    }
                }
                let status = if kinds.is_empty() {
                    ExecStatus::OptimizedOut
                } else {
                    ExecStatus::Executed
                };
                PerfCounter {
                    node: name.clone(),
                    op_type: op.clone(),
                    status,
                    real_us: real,
                    cpu_us: real,
                    exec_type: if kinds.is_empty() {
                        "unknown".into()
                    } else {
                        kinds.join("+")
                    },
                }
            })
            .collect()
    }
}

impl CompiledSubgraph for CompiledCpu {
    fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    fn infer(&self, inputs: &[Tensor]) -> Result<InferResult, PluginError> {
        crate::plugin::check_inputs(&self.inputs, inputs)?;
        self.run(&self.specialized(inputs)?, inputs)
    }

    fn export(&self) -> Result<Vec<Bytes>, PluginError> {
        Ok(blob::write(
            &self.device,
            BACKEND,
            BACKEND_VERSION,
            &self.config,
            &self.onnx,
        ))
    }
}
