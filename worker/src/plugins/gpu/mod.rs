//! The GPU plugin: WGSL compute kernels on wgpu (Vulkan, Metal, DX12; in
//! CI Mesa's lavapipe, a software Vulkan device). One device per adapter
//! (`GPU.0`, `GPU.1`, ...; config `DEVICE_ID` picks one, default 0;
//! `TESSERA_GPU_BACKEND` picks the wgpu backend). Tensors are f32, or f16
//! where the adapter has shader-f16 (stored as f16, computed in f32; Cast
//! converts between the two).
//!
//! Layout: [`context`] (adapter, device, pipelines compiled once per
//! kernel, buffers), [`program`] (a compiled subgraph: plans per input
//! shapes, buffers reused across requests, one submission per request),
//! [`builder`] (what planning a node records: buffers, shapes, kernel
//! launches), `plan` (a plan for one set of input shapes, its timestamps),
//! `calibrate` (GFLOPS and bandwidth measured), [`ops`] (what each op
//! supports and how it is planned; one file per op family), `query`
//! (QueryNetwork's verdict on a node), `shaders/` (the WGSL kernels).
//!
//! QueryNetwork is honest: op type, attributes, element types (f32, or f16
//! with shader-f16, one per node except Cast) and constant-ness of
//! shape-like inputs are all checked; anything else is unsupported and runs
//! elsewhere under HETERO.

pub mod builder;
mod calibrate;
pub mod context;
pub mod ops;
mod plan;
pub mod program;
mod query;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tessera_common::graph::Graph;
use tessera_common::onnx::decode_model_shared;
use tessera_common::onnx::proto::ModelProto;
use tessera_common::tensor::Tensor;

use crate::plugin::{
    blob, CompiledSubgraph, Config, ConfigKey, DevicePlugin, InferResult, MetricValue, PluginError,
    QueryResult, TensorSpec, METRICS,
};
use context::Gpu;
use program::Program;

const BACKEND: &str = "wgpu";
const BACKEND_VERSION: &str = "30";

pub struct GpuPlugin {
    backends: wgpu::Backends,
    /// Adapter names, by index.
    adapters: Vec<String>,
    devices: Mutex<HashMap<usize, Arc<Gpu>>>,
    config: Mutex<Config>,
    calibrated: OnceLock<(f64, f64)>,
}

impl GpuPlugin {
    /// Finds the adapters and opens the first (an error, with how to get a
    /// software adapter, where there is none).
    pub fn new() -> Result<GpuPlugin, PluginError> {
        let backend = std::env::var("TESSERA_GPU_BACKEND").ok();
        let backends = context::backends(backend.as_deref())?;
        let adapters: Vec<String> = context::adapters(backends)
            .iter()
            .map(|a| a.get_info().name)
            .collect();
        let plugin = GpuPlugin {
            backends,
            adapters,
            devices: Mutex::new(HashMap::new()),
            config: Mutex::new(Config::default()),
            calibrated: OnceLock::new(),
        };
        plugin.gpu(0)?;
        Ok(plugin)
    }

    /// Device `index`, opened on first use.
    fn gpu(&self, index: usize) -> Result<Arc<Gpu>, PluginError> {
        let mut devices = self
            .devices
            .lock()
            .map_err(|_| PluginError::Infer("GPU device table poisoned".into()))?;
        if let Some(g) = devices.get(&index) {
            return Ok(g.clone());
        }
        let gpu = Arc::new(Gpu::open(self.backends, index)?);
        devices.insert(index, gpu.clone());
        Ok(gpu)
    }

    fn device_of(&self, config: &Config) -> Result<Arc<Gpu>, PluginError> {
        self.gpu(config.device_id() as usize)
    }

    /// (GFLOPS, GB/s) measured once on device 0: a 512³ GEMM and a 64 MB
    /// copy.
    fn calibrate(&self) -> (f64, f64) {
        *self.calibrated.get_or_init(|| {
            self.gpu(0)
                .and_then(|g| calibrate::calibrate(&g))
                .unwrap_or((0.0, 0.0))
        })
    }
}

struct CompiledGpu {
    program: Program,
    device: String,
    config: Config,
}

impl CompiledSubgraph for CompiledGpu {
    fn inputs(&self) -> &[TensorSpec] {
        self.program.inputs()
    }
    fn outputs(&self) -> &[TensorSpec] {
        self.program.outputs()
    }
    fn infer(&self, inputs: &[Tensor]) -> Result<InferResult, PluginError> {
        self.program.infer(inputs)
    }
    fn export(&self) -> Result<Vec<Bytes>, PluginError> {
        // Pipelines and plans are rebuilt from the subgraph on import.
        Ok(blob::write(
            &self.device,
            BACKEND,
            BACKEND_VERSION,
            &self.config,
            &self.program.onnx,
        ))
    }
}

impl DevicePlugin for GpuPlugin {
    fn name(&self) -> &str {
        "GPU"
    }

    fn available_devices(&self) -> Vec<String> {
        (0..self.adapters.len())
            .map(|i| format!("GPU.{i}"))
            .collect()
    }

    fn metric(&self, name: &str) -> Result<MetricValue, PluginError> {
        let gpu = self.device_of(&self.config())?;
        Ok(match name {
            "FULL_DEVICE_NAME" => MetricValue::Text(format!(
                "{} ({:?}, wgpu {BACKEND_VERSION})",
                gpu.info.name, gpu.info.backend
            )),
            "AVAILABLE_DEVICES" => MetricValue::List(self.available_devices()),
            "SUPPORTED_METRICS" => {
                MetricValue::List(METRICS.iter().map(|s| s.to_string()).collect())
            }
            "SUPPORTED_CONFIG_KEYS" => {
                MetricValue::List(ConfigKey::ALL.map(|k| k.name().to_string()).to_vec())
            }
            "OPTIMIZATION_CAPABILITIES" => {
                let mut caps = vec!["FP32".to_string()];
                if gpu.shader_f16 {
                    caps.push("FP16".into());
                }
                MetricValue::List(caps)
            }
            "RANGE_FOR_ASYNC_INFER_REQUESTS" => MetricValue::Range(1, 4, 1),
            "IMPORT_EXPORT_SUPPORT" => MetricValue::Bool(true),
            "DEVICE_ARCHITECTURE" => MetricValue::Text(format!(
                "{:?} {:?} {} {} (vendor {:#x}, device {:#x})",
                gpu.info.backend,
                gpu.info.device_type,
                gpu.info.driver,
                gpu.info.driver_info,
                gpu.info.vendor,
                gpu.info.device
            )),
            "GFLOPS" => MetricValue::Number(self.calibrate().0),
            "MEMORY_BANDWIDTH_GBPS" => MetricValue::Number(self.calibrate().1),
            "MEMORY_BYTES" => MetricValue::Number(gpu.memory_bytes as f64),
            other => {
                return Err(PluginError::UnknownMetric {
                    name: other.into(),
                    supported: METRICS.join(", "),
                })
            }
        })
    }

    fn set_config(&self, key: &str, value: &str) -> Result<(), PluginError> {
        self.config
            .lock()
            .map_err(|_| PluginError::Infer("config lock poisoned".into()))?
            .set(key, value)
    }

    fn config(&self) -> Config {
        self.config.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn query_network(&self, model: &ModelProto) -> Result<QueryResult, PluginError> {
        let graph = Graph::from_model(model.clone())
            .map_err(|e| PluginError::InvalidModel(e.to_string()))?;
        let gpu = self.device_of(&self.config())?;
        let query = query::Query {
            graph: &graph,
            nodes: model
                .graph
                .as_ref()
                .map(|g| g.node.as_slice())
                .unwrap_or(&[]),
            opset: ops::opset(model),
            half: gpu.shader_f16,
            max_binding: gpu.max_binding,
        };
        let mut result = QueryResult::default();
        for &id in graph.topo_ops() {
            let node = graph.node(id);
            result.record(node.name.clone(), query.verdict(node));
        }
        Ok(result)
    }

    fn compile(
        &self,
        onnx: &Bytes,
        config: &Config,
    ) -> Result<Arc<dyn CompiledSubgraph>, PluginError> {
        let config = self.config().merged(config);
        let model = decode_model_shared(onnx.clone())
            .map_err(|e| PluginError::InvalidModel(e.to_string()))?;
        let gpu = self.device_of(&config)?;
        let perf = config.perf_count();
        Ok(Arc::new(CompiledGpu {
            program: Program::new(gpu, &model, onnx.clone(), perf)?,
            device: self.name().into(),
            config,
        }))
    }

    fn import(&self, blob: &Bytes) -> Result<Arc<dyn CompiledSubgraph>, PluginError> {
        let (config, payload) = blob::read(blob, "GPU", BACKEND, BACKEND_VERSION)?;
        self.compile(&payload, &config)
    }
}
