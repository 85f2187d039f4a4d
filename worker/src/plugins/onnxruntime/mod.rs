//! The CPU plugin on onnxruntime (its C API through `ort`, the library
//! loaded at run time from the onnxruntime 1.32.0 wheel; see [`library`]).
//!
//! Layout: `library` finds and loads the shared library; `query` answers
//! QueryNetwork (the whole model, else node by node); `opset` runs models
//! at opset 22 at 21 where onnxruntime lacks a kernel; `session` is the
//! compiled subgraph (a pool of sessions, per-node profiling); `source`
//! keeps its model between sessions (a large one in a temporary file);
//! `convert` moves tensors in and out, `values` sequences and optionals;
//! `profile` reads onnxruntime's profiler output; `ggml` registers
//! Tessera's kernels over llama.cpp's weight blocks as custom operators.
//!
//! ```no_run
//! use tessera_worker::plugin::DevicePlugin;
//! use tessera_worker::plugins::onnxruntime::OrtPlugin;
//! let cpu = OrtPlugin::named("CPU", None)?; // ORT_DYLIB_PATH or the Python package
//! let compiled = cpu.compile(&std::fs::read("subgraph_0.onnx")?.into(), &Default::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod library;

mod convert;
mod ggml;
mod opset;
mod profile;
mod query;
mod session;
mod source;
mod values;

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tessera_common::onnx::proto::{GraphProto, ModelProto, NodeProto, OperatorSetIdProto};
use tessera_common::onnx::{decode_model_shared, encode_model};
use tessera_common::tensor::Tensor;

pub use self::session::CompiledOrt;
use self::session::Keep;
use crate::plugin::{
    blob, CompiledSubgraph, Config, DevicePlugin, MetricValue, PluginError, QueryResult,
};
use crate::plugins::probe::ProbeCache;
use library::Runtime;

const BACKEND: &str = "onnxruntime";

/// The CPU plugin on onnxruntime.
pub struct OrtPlugin {
    name: String,
    runtime: Arc<Runtime>,
    config: Mutex<Config>,
    probes: ProbeCache,
}

impl OrtPlugin {
    /// The plugin under device name `name`, with onnxruntime loaded from
    /// `library` or the usual places ([`library::load`]).
    pub fn named(name: &str, library: Option<&Path>) -> Result<OrtPlugin, PluginError> {
        let runtime = library::load(library).map_err(|reason| PluginError::Unavailable {
            plugin: name.into(),
            reason: reason.to_string(),
        })?;
        Ok(OrtPlugin {
            name: name.into(),
            runtime,
            config: Mutex::new(Config::default()),
            probes: ProbeCache::default(),
        })
    }

    /// The loaded library's version, e.g. `1.32.0`.
    pub fn version(&self) -> &str {
        &self.runtime.version
    }

    /// GFLOP/s of a 256³ f32 MatMul through onnxruntime (one thread, the
    /// fastest of 8 runs), and
    /// memory bandwidth (GB/s) of a 64 MiB copy; measured once per process
    /// (every instance runs on the same machine: an embedded cluster's
    /// workers share it).
    fn calibrate(&self) -> (f64, f64) {
        static CALIBRATION: OnceLock<(f64, f64)> = OnceLock::new();
        *CALIBRATION.get_or_init(|| {
            crate::plugins::remembered_calibration("onnxruntime", || {
                let gflops = self.matmul_gflops(256).unwrap_or_else(|e| {
                    tracing::warn!("onnxruntime calibration failed: {e}");
                    0.0
                });
                (gflops, crate::plugins::memory_bandwidth_gbps())
            })
        })
    }

    fn matmul_gflops(&self, n: usize) -> Result<f64, PluginError> {
        let b = Tensor::new(
            tessera_common::onnx::ElemType::FLOAT,
            vec![n, n],
            vec![0u8; n * n * 4],
        )
        .map_err(|e| PluginError::Infer(e.to_string()))?;
        let model = ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(17),
            }],
            graph: Some(GraphProto {
                name: Some("calibration".into()),
                node: vec![NodeProto {
                    name: Some("mm".into()),
                    op_type: Some("MatMul".into()),
                    input: vec!["a".into(), "b".into()],
                    output: vec!["c".into()],
                    ..Default::default()
                }],
                initializer: vec![b.to_proto("b")],
                input: vec![tessera_common::onnx::tensor_info(
                    "a",
                    1,
                    &[n as i64, n as i64],
                )],
                output: vec![tessera_common::onnx::tensor_info(
                    "c",
                    1,
                    &[n as i64, n as i64],
                )],
                ..Default::default()
            }),
            ..Default::default()
        };
        let compiled = self.compile(
            &Bytes::from(tessera_common::onnx::encode_model(&model)),
            &Config::default(),
        )?;
        let a = Tensor::new(
            tessera_common::onnx::ElemType::FLOAT,
            vec![n, n],
            vec![0u8; n * n * 4],
        )
        .map_err(|e| PluginError::Infer(e.to_string()))?;
        compiled.infer(std::slice::from_ref(&a))?;
        crate::plugins::fastest_gflops(2.0 * (n * n * n) as f64, 8, || {
            compiled.infer(std::slice::from_ref(&a)).map(drop)
        })
    }
}

impl DevicePlugin for OrtPlugin {
    fn name(&self) -> &str {
        &self.name
    }

    fn available_devices(&self) -> Vec<String> {
        vec![format!("{}.0", self.name)]
    }

    fn metric(&self, name: &str) -> Result<MetricValue, PluginError> {
        let backend = format!("onnxruntime {}", self.runtime.version);
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
        let lowered = opset::lowered(model);
        let model = lowered.as_ref().unwrap_or(model);
        query::query_network(&self.runtime, model, &self.probes)
    }

    fn compile(
        &self,
        onnx: &Bytes,
        config: &Config,
    ) -> Result<Arc<dyn CompiledSubgraph>, PluginError> {
        let config = self.config().merged(config);
        let model = decode_model_shared(onnx.clone())
            .map_err(|e| PluginError::InvalidModel(e.to_string()))?;
        let (model, onnx) = match opset::lowered(&model) {
            Some(m) => {
                let bytes = Bytes::from(encode_model(&m));
                (m, bytes)
            }
            None => (model, onnx.clone()),
        };
        let onnx = &onnx;
        let build = |model: &ModelProto, onnx: &Bytes| {
            CompiledOrt::from_model(
                &self.name,
                self.runtime.clone(),
                (model, onnx),
                config.clone(),
                Keep::InFolder,
            )
        };
        // Nodes onnxruntime refuses are decomposed as QueryNetwork did:
        // those it computes wrongly always, those it lacks when the model
        // does not build as it is.
        let decomposed =
            |why: Option<PluginError>| -> Result<Arc<dyn CompiledSubgraph>, PluginError> {
                match query::for_onnxruntime(&self.runtime, &model, &self.probes)? {
                    Some(m) => Ok(Arc::new(build(&m, &Bytes::from(encode_model(&m)))?)),
                    None => match why {
                        Some(e) => Err(e),
                        None => Ok(Arc::new(build(&model, onnx)?)),
                    },
                }
            };
        if query::has_known_wrong(&model) {
            return decomposed(None);
        }
        match build(&model, onnx) {
            Ok(c) => Ok(Arc::new(c)),
            Err(e) => decomposed(Some(e)),
        }
    }

    fn import(&self, blob: &Bytes) -> Result<Arc<dyn CompiledSubgraph>, PluginError> {
        let (config, payload) = blob::read(blob, &self.name, BACKEND, &self.runtime.version)?;
        // The blob carries the subgraph; onnxruntime optimizes it again.
        // A blob from the compile cache is a mapped file: the subgraph
        // keeps its bytes as they are.
        Ok(Arc::new(CompiledOrt::new(
            &self.name,
            self.runtime.clone(),
            &payload,
            config,
            Keep::Shared,
        )?))
    }

    fn import_file(
        &self,
        blob: &Bytes,
        file: &std::path::Path,
    ) -> Result<Arc<dyn CompiledSubgraph>, PluginError> {
        let (config, payload) = blob::read(blob, &self.name, BACKEND, &self.runtime.version)?;
        // The cache's file is the weights' external data as it is: a large
        // stage's sessions map them from it (through a link), not copied.
        let keep = Keep::Linked {
            file: file.to_path_buf(),
            base: blob.clone(),
        };
        Ok(Arc::new(CompiledOrt::new(
            &self.name,
            self.runtime.clone(),
            &payload,
            config,
            keep,
        )?))
    }
}
