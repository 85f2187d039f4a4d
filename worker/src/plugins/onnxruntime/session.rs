//! A subgraph compiled by onnxruntime: sessions built from the exported
//! subgraph's bytes, run one request at a time each.
//!
//! onnxruntime's `Run` is driven through `&mut Session` (some of its
//! allocators and statistics are not thread-safe), so a compiled subgraph
//! keeps a pool: a request takes an idle session or, when every session is
//! busy (several requests at once through HETERO), builds another. An actor
//! runs its subgraph one request at a time, so a cluster keeps one.
//!
//! With PERF_COUNT=YES a request runs on a session built with onnxruntime's
//! profiler on; the profile (per-node kernel times) is read after the run
//! and the session dropped, since onnxruntime profiles a session only until
//! its profile is ended.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ort::session::builder::GraphOptimizationLevel;
use ort::session::{Session, SessionInputValue};
use tessera_common::onnx::decode_model;
use tessera_common::onnx::proto::ModelProto;
use tessera_common::tensor::Tensor;

use super::library::Runtime;
use super::{convert, BACKEND};
use crate::plugin::{
    blob, CompiledSubgraph, Config, ExecStatus, InferResult, PerfCounter, PluginError, TensorSpec,
};

/// How sessions of one compiled subgraph are built.
#[derive(Clone)]
pub(super) struct SessionSettings {
    /// Intra-op threads (NUM_THREADS, default 1); inter-op is 1 and
    /// threads do not spin.
    pub threads: usize,
}

impl SessionSettings {
    pub fn from_config(config: &Config) -> Result<SessionSettings, PluginError> {
        let threads = match config.get("NUM_THREADS") {
            None => 1,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(PluginError::BadConfigValue {
                        key: "NUM_THREADS".into(),
                        value: v.into(),
                        allowed: "a number of threads >= 1".into(),
                    })
                }
            },
        };
        Ok(SessionSettings { threads })
    }
}

/// Builds a session for `onnx`; `profile`: the profiler's file prefix.
pub(super) fn build_session(
    runtime: &Runtime,
    onnx: &[u8],
    settings: &SessionSettings,
    optimize: bool,
    profile: Option<&Path>,
) -> Result<Session, String> {
    let level = if optimize {
        GraphOptimizationLevel::All
    } else {
        GraphOptimizationLevel::Disable
    };
    let text = |e: ort::Error<ort::session::builder::SessionBuilder>| e.to_string();
    let mut builder = Session::builder(&runtime.env).map_err(|e| e.to_string())?;
    builder = builder.with_optimization_level(level).map_err(text)?;
    builder = builder.with_intra_threads(settings.threads).map_err(text)?;
    builder = builder.with_inter_threads(1).map_err(text)?;
    builder = builder.with_intra_op_spinning(false).map_err(text)?;
    builder = builder.with_inter_op_spinning(false).map_err(text)?;
    if let Some(prefix) = profile {
        builder = builder.with_profiling(prefix).map_err(|e| e.to_string())?;
    }
    builder.commit_from_memory(onnx).map_err(|e| e.to_string())
}

/// A subgraph compiled by onnxruntime.
pub struct CompiledOrt {
    device: String,
    version: String,
    runtime: Arc<Runtime>,
    onnx: Vec<u8>,
    config: Config,
    settings: SessionSettings,
    /// Whether onnxruntime's graph optimizations apply (see `new`).
    optimize: bool,
    perf: bool,
    idle: Mutex<Vec<Session>>,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    /// Original ONNX nodes (name, op type), for performance counters.
    nodes: Vec<(String, String)>,
}

fn compile_error(reason: String) -> PluginError {
    PluginError::Compile {
        backend: BACKEND.into(),
        reason,
    }
}

impl CompiledOrt {
    pub(super) fn new(
        device: &str,
        runtime: Arc<Runtime>,
        onnx: &[u8],
        config: Config,
    ) -> Result<CompiledOrt, PluginError> {
        let model = decode_model(onnx).map_err(|e| PluginError::InvalidModel(e.to_string()))?;
        CompiledOrt::from_model(device, runtime, &model, onnx, config)
    }

    /// [`CompiledOrt::new`] for a model already decoded from `onnx`.
    pub(super) fn from_model(
        device: &str,
        runtime: Arc<Runtime>,
        model: &ModelProto,
        onnx: &[u8],
        config: Config,
    ) -> Result<CompiledOrt, PluginError> {
        let graph = model
            .graph
            .as_ref()
            .ok_or_else(|| PluginError::InvalidModel("no graph".into()))?;
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
        let settings = SessionSettings::from_config(&config)?;
        let (session, optimize) = match build_session(&runtime, onnx, &settings, true, None) {
            Ok(s) => (s, true),
            // onnxruntime's optimizers refuse some models its kernels run
            // (a Range fed 1-element tensors once an If is inlined): such a
            // subgraph runs unoptimized rather than not at all.
            Err(optimized) => match build_session(&runtime, onnx, &settings, false, None) {
                Ok(s) => {
                    tracing::warn!(device, "onnxruntime's graph optimizations fail on this subgraph ({optimized}); running it unoptimized");
                    (s, false)
                }
                Err(_) => return Err(compile_error(optimized)),
            },
        };
        let spec_of = |o: &ort::value::Outlet| {
            convert::spec(o.name(), o.dtype()).ok_or_else(|| {
                PluginError::InvalidModel(format!(
                    "'{}' is a {}, not a tensor of a type tensors here carry",
                    o.name(),
                    o.dtype()
                ))
            })
        };
        let inputs = session
            .inputs()
            .iter()
            .map(spec_of)
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = session
            .outputs()
            .iter()
            .map(spec_of)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CompiledOrt {
            device: device.into(),
            version: runtime.version.clone(),
            perf: config.get("PERF_COUNT") == Some("YES"),
            runtime,
            onnx: onnx.to_vec(),
            config,
            settings,
            optimize,
            idle: Mutex::new(vec![session]),
            inputs,
            outputs,
            nodes,
        })
    }

    /// An idle session, or a new one when all are busy.
    fn take_session(&self) -> Result<Session, PluginError> {
        if let Some(s) = self.idle.lock().ok().and_then(|mut idle| idle.pop()) {
            return Ok(s);
        }
        tracing::debug!(device = %self.device, "every session busy: building another");
        build_session(
            &self.runtime,
            &self.onnx,
            &self.settings,
            self.optimize,
            None,
        )
        .map_err(|e| PluginError::Infer(format!("cannot build another session: {e}")))
    }

    /// Runs `inputs` on `session`; the outputs in declared order.
    fn run_on(&self, session: &mut Session, inputs: &[Tensor]) -> Result<Vec<Tensor>, PluginError> {
        let mut feeds: Vec<(Cow<'_, str>, SessionInputValue<'_>)> =
            Vec::with_capacity(inputs.len());
        for (t, spec) in inputs.iter().zip(&self.inputs) {
            feeds.push((
                Cow::Borrowed(spec.name.as_str()),
                convert::to_ort(t)?.into(),
            ));
        }
        let mut outputs = session
            .run(feeds)
            .map_err(|e| PluginError::Infer(format!("onnxruntime: {e}")))?;
        self.outputs
            .iter()
            .map(|spec| {
                let value = outputs.remove(spec.name.as_str()).ok_or_else(|| {
                    PluginError::Infer(format!("onnxruntime returned no '{}'", spec.name))
                })?;
                convert::from_ort(&spec.name, value)
            })
            .collect()
    }

    /// Runs on a profiling session and reads per-node times from its profile.
    fn run_profiled(&self, inputs: &[Tensor]) -> Result<InferResult, PluginError> {
        static PROFILES: AtomicU64 = AtomicU64::new(0);
        let prefix: PathBuf = std::env::temp_dir().join(format!(
            "tessera-ort-profile-{}-{}",
            std::process::id(),
            PROFILES.fetch_add(1, Ordering::Relaxed)
        ));
        let mut session = build_session(
            &self.runtime,
            &self.onnx,
            &self.settings,
            self.optimize,
            Some(&prefix),
        )
        .map_err(|e| PluginError::Infer(format!("cannot build a profiling session: {e}")))?;
        let outputs = self.run_on(&mut session, inputs)?;
        let file = session
            .end_profiling()
            .map_err(|e| PluginError::Infer(format!("onnxruntime profile: {e}")))?;
        let text = std::fs::read_to_string(&file);
        let _ = std::fs::remove_file(&file);
        let times = text
            .map(|t| super::profile::node_times(&t))
            .unwrap_or_default();
        Ok(InferResult {
            outputs,
            counters: self.counters(&times),
        })
    }

    fn counters(
        &self,
        times: &std::collections::HashMap<String, (u64, String)>,
    ) -> Vec<PerfCounter> {
        self.nodes
            .iter()
            .map(|(name, op)| {
                // onnxruntime names fused nodes after what they replace
                // (`<node>_kernel_time`, fusions keep the first node's name).
                let hit = times.get(name);
                PerfCounter {
                    node: name.clone(),
                    op_type: op.clone(),
                    status: if hit.is_some() {
                        ExecStatus::Executed
                    } else {
                        ExecStatus::OptimizedOut
                    },
                    real_us: hit.map_or(0, |h| h.0),
                    cpu_us: hit.map_or(0, |h| h.0),
                    exec_type: hit.map_or_else(|| "unknown".into(), |h| h.1.clone()),
                }
            })
            .collect()
    }
}

impl CompiledSubgraph for CompiledOrt {
    fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    fn infer(&self, inputs: &[Tensor]) -> Result<InferResult, PluginError> {
        crate::plugin::check_inputs(&self.inputs, inputs)?;
        if self.perf {
            return self.run_profiled(inputs);
        }
        let mut session = self.take_session()?;
        let result = self.run_on(&mut session, inputs);
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(session);
        }
        Ok(InferResult {
            outputs: result?,
            counters: Vec::new(),
        })
    }

    fn export(&self) -> Result<Vec<u8>, PluginError> {
        Ok(blob::write(
            &self.device,
            BACKEND,
            &self.version,
            &self.config,
            &self.onnx,
        ))
    }
}
