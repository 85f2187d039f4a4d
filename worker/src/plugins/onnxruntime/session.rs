//! A subgraph compiled by onnxruntime: sessions built from the exported
//! subgraph's bytes, run one request at a time each.
//!
//! onnxruntime's `Run` is driven through `&mut Session` (some of its
//! allocators and statistics are not thread-safe), so a compiled subgraph
//! keeps a pool: a request takes an idle session or, when every session is
//! busy (several requests at once through HETERO), builds another. An actor
//! runs its subgraph one request at a time, so a cluster keeps one.
//!
//! Graphs that take or return sequences and optionals run through
//! `infer_values` (see `values` for what is rewritten in the model).
//!
//! With PERF_COUNT=YES a request runs on a session built with onnxruntime's
//! profiler on; the profile (per-node kernel times) is read after the run
//! and the session dropped, since onnxruntime profiles a session only until
//! its profile is ended.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use ort::session::builder::GraphOptimizationLevel;

use super::source::ModelSource;
use ort::session::{Session, SessionInputValue};
use tessera_common::onnx::proto::ModelProto;
use tessera_common::onnx::{decode_model_shared, encode_model};
use tessera_common::tensor::{Tensor, Value};

use super::library::Runtime;
use super::values::{self, OptionalOutput};
use super::BACKEND;
use crate::plugin::{
    blob, CompiledSubgraph, Config, ExecStatus, InferResult, PerfCounter, PerformanceHint,
    PluginError, TensorSpec, ValueKind,
};

/// Feeds of one run, by input name.
type Feeds<'a> = Vec<(Cow<'a, str>, SessionInputValue<'a>)>;

/// How sessions of one compiled subgraph are built.
#[derive(Clone)]
pub(super) struct SessionSettings {
    /// Intra-op threads (NUM_THREADS, default 1); inter-op is 1.
    pub threads: usize,
    /// Whether the intra-op threads spin between the parallel sections of
    /// a run instead of sleeping (onnxruntime's default): with more than
    /// one thread, unless PERFORMANCE_HINT=THROUGHPUT. A decode step of a
    /// small model is ~1,500 kernels of tens of microseconds, and waking a
    /// sleeping thread for each costs about what the second thread saves:
    /// SmolLM2-135M 4-bit, 2 threads, 86 tokens/s sleeping against 106
    /// spinning (1 thread: 84).
    pub spin: bool,
}

impl SessionSettings {
    pub fn from_config(config: &Config) -> Result<SessionSettings, PluginError> {
        let threads = config.num_threads().unwrap_or(1);
        let throughput = config.performance_hint() == Some(PerformanceHint::Throughput);
        Ok(SessionSettings {
            threads,
            spin: threads > 1 && !throughput,
        })
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
    configured(runtime, settings, optimize, profile)?
        .commit_from_memory(onnx)
        .map_err(|e| e.to_string())
}

/// Builds a session of a compiled subgraph's model: as rewritten, else as
/// kept (a large one from its folder, its weights mapped).
fn build_kept(
    runtime: &Runtime,
    (rewritten, source): (Option<&[u8]>, &ModelSource),
    settings: &SessionSettings,
    optimize: bool,
    profile: Option<&Path>,
) -> Result<Session, String> {
    let mut builder = configured(runtime, settings, optimize, profile)?;
    let built = match (rewritten, source) {
        (Some(rewritten), _) => builder.commit_from_memory(rewritten),
        (None, ModelSource::Memory(onnx)) => builder.commit_from_memory(onnx),
        (None, ModelSource::Folder(folder)) => builder.commit_from_file(folder.model()),
    };
    built.map_err(|e| e.to_string())
}

/// A session builder with these settings.
fn configured(
    runtime: &Runtime,
    settings: &SessionSettings,
    optimize: bool,
    profile: Option<&Path>,
) -> Result<ort::session::builder::SessionBuilder, String> {
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
    builder = builder
        .with_intra_op_spinning(settings.spin)
        .map_err(text)?;
    if settings.spin {
        // Spinning within a run only: between runs the threads sleep, so
        // the step's round trip (the network threads, other subgraphs) is
        // not left to compete with them for the cores.
        builder = builder
            .with_config_entry("session.force_spinning_stop", "1")
            .map_err(text)?;
    }
    builder = builder.with_inter_op_spinning(false).map_err(text)?;
    // onnxruntime's CPU arena keeps the most a session ever used, grown by
    // powers of two; without it, tensors come from the heap and go back.
    // SmolLM2-135M 4-bit serving 8 streams: the worker's peak 400 MiB with
    // the arena, 321 MiB without, at the same speed (88.5 and 92.2 output
    // tokens/s; one sequence 73–81 and 75–82 tokens/s).
    builder = builder
        .with_execution_providers([ort::ep::CPU::default().with_arena_allocator(false).build()])
        .map_err(text)?;
    let kernels = super::ggml::domain().map_err(|e| e.to_string())?;
    builder = builder.with_operators(kernels).map_err(text)?;
    if let Some(prefix) = profile {
        builder = builder.with_profiling(prefix).map_err(|e| e.to_string())?;
    }
    Ok(builder)
}

/// What a session takes and gives.
struct SessionSpecs {
    inputs: Vec<TensorSpec>,
    /// An optional output is the graph's under its name, its kind optional.
    outputs: Vec<TensorSpec>,
    /// The session's own names of its outputs.
    session_outputs: Vec<String>,
}

/// The specs of a session's inputs and outputs.
fn session_specs(
    session: &Session,
    graph: &tessera_common::onnx::proto::GraphProto,
    optional_outputs: &[OptionalOutput],
) -> Result<SessionSpecs, PluginError> {
    // onnxruntime reports a tensor declared without a shape as of rank 0:
    // such a tensor's shape is unknown (any rank is taken).
    let unshaped: std::collections::HashSet<&str> = graph
        .input
        .iter()
        .chain(&graph.output)
        .filter(|v| TensorSpec::from_value_info(v).is_some_and(|s| s.shape.is_none()))
        .filter_map(|v| v.name.as_deref())
        .collect();
    let spec_of = |o: &ort::value::Outlet| {
        let mut spec = values::spec(o.name(), o.dtype()).ok_or_else(|| {
            PluginError::InvalidModel(format!(
                "'{}' is a {}, not a tensor of a type tensors here carry",
                o.name(),
                o.dtype()
            ))
        })?;
        if unshaped.contains(spec.name.as_str()) {
            spec.shape = None;
        }
        Ok::<_, PluginError>(spec)
    };
    let inputs = session
        .inputs()
        .iter()
        .map(spec_of)
        .collect::<Result<Vec<_>, _>>()?;
    let mut outputs = session
        .outputs()
        .iter()
        .take(graph.output.len())
        .map(spec_of)
        .collect::<Result<Vec<_>, _>>()?;
    let session_outputs = outputs.iter().map(|o| o.name.clone()).collect();
    for o in optional_outputs {
        let spec = &mut outputs[o.index];
        spec.name = graph.output[o.index].name.clone().unwrap_or_default();
        spec.kind = match spec.kind {
            ValueKind::Sequence => ValueKind::OptionalSequence,
            _ => ValueKind::OptionalTensor,
        };
    }
    Ok(SessionSpecs {
        inputs,
        outputs,
        session_outputs,
    })
}

/// A subgraph compiled by onnxruntime.
pub struct CompiledOrt {
    device: String,
    version: String,
    runtime: Arc<Runtime>,
    /// The subgraph as compiled (what `export` writes and sessions are
    /// built from): a large one in a folder, its weights as external data
    /// onnxruntime maps, else the deployed bytes themselves (not a copy).
    source: ModelSource,
    /// What sessions are built from when it differs from `onnx` (optional
    /// outputs unwrapped).
    rewritten: Option<Vec<u8>>,
    /// The model the variants for empty sequence inputs are made from
    /// (only where an input is a sequence).
    variant_base: Option<ModelProto>,
    /// Optional outputs, returned by sessions as contents and a flag.
    optional_outputs: Vec<OptionalOutput>,
    /// Session names of the outputs, in `outputs` order.
    session_outputs: Vec<String>,
    /// Idle sessions of the variants with empty sequence inputs made in
    /// the model, by the positions of those inputs.
    variants: Mutex<HashMap<Vec<usize>, Vec<Session>>>,
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

/// Where a compiled subgraph keeps its model (for the sessions it builds).
#[derive(Debug, Clone)]
pub(super) enum Keep {
    /// A large model in a temporary folder, its weights as external data
    /// onnxruntime maps (the bytes came over the network: in memory they
    /// would be held twice, then on onnxruntime's heap).
    InFolder,
    /// The bytes as given, shared.
    Shared,
    /// The bytes are `base`'s, the whole of `file` mapped (the compile
    /// cache's): a large model's weights are external data where they are
    /// in that file, reached through a link beside it (writing them again
    /// would cost a second load 0.3–1 s a stage).
    Linked { file: PathBuf, base: Bytes },
}

impl CompiledOrt {
    /// A subgraph from its model's bytes (`keep`: where it keeps them).
    pub(super) fn new(
        device: &str,
        runtime: Arc<Runtime>,
        onnx: &Bytes,
        config: Config,
        keep: Keep,
    ) -> Result<CompiledOrt, PluginError> {
        let model = decode_model_shared(onnx.clone())
            .map_err(|e| PluginError::InvalidModel(e.to_string()))?;
        CompiledOrt::from_model(device, runtime, (&model, onnx), config, keep)
    }

    /// [`CompiledOrt::new`] for a model already decoded from `onnx`.
    pub(super) fn from_model(
        device: &str,
        runtime: Arc<Runtime>,
        (model, onnx): (&ModelProto, &Bytes),
        config: Config,
        keep: Keep,
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
        let unwrapped =
            values::unwrap_optional_outputs(model).map_err(PluginError::InvalidModel)?;
        let rewritten = unwrapped.as_ref().map(|(m, _)| encode_model(m));
        let variant_base =
            has_sequence_input(graph).then(|| unwrapped.as_ref().map_or(model, |(m, _)| m).clone());
        let optional_outputs = unwrapped.map(|(_, o)| o).unwrap_or_default();
        let started = std::time::Instant::now();
        // Kept before the first session: a large model's is built from its
        // folder, its weights mapped rather than copied.
        let source = match keep {
            Keep::InFolder => ModelSource::keep(model, onnx),
            Keep::Shared => ModelSource::Memory(onnx.clone()),
            Keep::Linked { file, base } => ModelSource::linked(model, onnx, (&file, &base)),
        };
        let kept = (rewritten.as_deref(), &source);
        let (session, optimize) = match build_kept(&runtime, kept, &settings, true, None) {
            Ok(s) => (s, true),
            // onnxruntime's optimizers refuse some models its kernels run
            // (a Range fed 1-element tensors once an If is inlined): such a
            // subgraph runs unoptimized rather than not at all.
            Err(optimized) => match build_kept(&runtime, kept, &settings, false, None) {
                Ok(s) => {
                    tracing::warn!(device, "onnxruntime's graph optimizations fail on this subgraph ({optimized}); running it unoptimized");
                    (s, false)
                }
                Err(_) => return Err(compile_error(optimized)),
            },
        };
        tracing::debug!(
            session_ms = started.elapsed().as_millis(),
            rewritten = rewritten.is_some(),
            "onnxruntime session built"
        );
        let SessionSpecs {
            inputs,
            outputs,
            session_outputs,
        } = session_specs(&session, graph, &optional_outputs)?;
        Ok(CompiledOrt {
            device: device.into(),
            version: runtime.version.clone(),
            perf: config.perf_count(),
            runtime,
            source,
            rewritten,
            variant_base,
            optional_outputs,
            session_outputs,
            variants: Mutex::new(HashMap::new()),
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
        self.new_session(None)
            .map_err(|e| PluginError::Infer(format!("cannot build another session: {e}")))
    }

    /// Another session of this subgraph (`profile`: the profiler's file
    /// prefix), from the model as rewritten or as kept.
    fn new_session(&self, profile: Option<&Path>) -> Result<Session, String> {
        let kept = (self.rewritten.as_deref(), &self.source);
        build_kept(&self.runtime, kept, &self.settings, self.optimize, profile)
    }

    /// An idle session of the variant with the inputs at `empty` made in
    /// the model, or a new one.
    fn take_variant(&self, empty: &[usize]) -> Result<Session, PluginError> {
        let idle = self
            .variants
            .lock()
            .ok()
            .and_then(|mut v| v.get_mut(empty).and_then(Vec::pop));
        if let Some(s) = idle {
            return Ok(s);
        }
        let Some(model) = &self.variant_base else {
            return Err(PluginError::BadInput("no input here is a sequence".into()));
        };
        let variant = values::with_empty_sequences(model, &self.inputs, empty);
        build_session(
            &self.runtime,
            &encode_model(&variant),
            &self.settings,
            self.optimize,
            None,
        )
        .map_err(|e| PluginError::Infer(format!("cannot build a session for empty sequences: {e}")))
    }

    /// Feeds for `inputs`: every one a plain value, or left out (an empty
    /// optional; an empty sequence, made in the model's variant).
    fn feeds<'a>(&'a self, inputs: &[Value]) -> Result<Feeds<'a>, PluginError> {
        let mut feeds = Vec::with_capacity(inputs.len());
        for (v, spec) in inputs.iter().zip(&self.inputs) {
            if let Some(value) = values::to_ort(v)? {
                feeds.push((Cow::Borrowed(spec.name.as_str()), value));
            }
        }
        Ok(feeds)
    }

    /// Runs `feeds` on `session`; the outputs in declared order.
    fn run_on(&self, session: &mut Session, feeds: Feeds<'_>) -> Result<Vec<Value>, PluginError> {
        let mut outputs = session
            .run(feeds)
            .map_err(|e| PluginError::Infer(format!("onnxruntime: {e}")))?;
        let mut take = |name: &str| {
            outputs
                .remove(name)
                .ok_or_else(|| PluginError::Infer(format!("onnxruntime returned no '{name}'")))
        };
        let mut values = Vec::with_capacity(self.outputs.len());
        for (spec, name) in self.outputs.iter().zip(&self.session_outputs) {
            values.push(values::from_ort(spec, take(name)?)?);
        }
        for o in &self.optional_outputs {
            let flag = super::convert::from_ort(&o.has, take(&o.has)?)?;
            let contents = std::mem::replace(&mut values[o.index], Value::Optional(None));
            if values::holds_element(&flag) {
                values[o.index] = Value::Optional(Some(Box::new(contents)));
            }
        }
        Ok(values)
    }

    /// Runs tensors; the outputs must be tensors too.
    fn run_tensors(
        &self,
        session: &mut Session,
        inputs: &[Tensor],
    ) -> Result<Vec<Tensor>, PluginError> {
        let mut feeds: Feeds<'_> = Vec::with_capacity(inputs.len());
        for (t, spec) in inputs.iter().zip(&self.inputs) {
            let value = match super::convert::view(t)? {
                Some(view) => view,
                None => super::convert::to_ort(t)?.into(),
            };
            feeds.push((Cow::Borrowed(spec.name.as_str()), value));
        }
        self.run_on(session, feeds)?
            .into_iter()
            .zip(&self.outputs)
            .map(|(v, spec)| match v {
                Value::Tensor(t) => Ok(t),
                other => Err(PluginError::Infer(format!(
                    "output '{}' is a {other}: run this subgraph with infer_values",
                    spec.name
                ))),
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
        let mut session = self
            .new_session(Some(&prefix))
            .map_err(|e| PluginError::Infer(format!("cannot build a profiling session: {e}")))?;
        let outputs = self.run_tensors(&mut session, inputs)?;
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
        let result = self.run_tensors(&mut session, inputs);
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(session);
        }
        Ok(InferResult {
            outputs: result?,
            counters: Vec::new(),
        })
    }

    /// Runs graph values (no performance counters on this path).
    fn infer_values(&self, inputs: &[Value]) -> Result<Vec<Value>, PluginError> {
        crate::plugin::check_values(&self.inputs, inputs)?;
        let empty = values::empty_sequence_inputs(inputs);
        let feeds = self.feeds(inputs)?;
        if empty.is_empty() {
            let mut session = self.take_session()?;
            let result = self.run_on(&mut session, feeds);
            if let Ok(mut idle) = self.idle.lock() {
                idle.push(session);
            }
            return result;
        }
        let mut session = self.take_variant(&empty)?;
        let result = self.run_on(&mut session, feeds);
        if let Ok(mut variants) = self.variants.lock() {
            variants.entry(empty).or_default().push(session);
        }
        result
    }

    fn export(&self) -> Result<Vec<Bytes>, PluginError> {
        let pieces = self.source.pieces().map_err(PluginError::Infer)?;
        let made_by = (self.device.as_str(), BACKEND, self.version.as_str());
        Ok(blob::write_pieces(made_by, &self.config, pieces))
    }
}

/// Whether a graph input is a sequence (or an optional of one), which an
/// empty request value makes a variant of the model for.
fn has_sequence_input(graph: &tessera_common::onnx::proto::GraphProto) -> bool {
    use tessera_common::onnx::proto::type_proto::Value as T;
    graph
        .input
        .iter()
        .any(|v| match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(T::SequenceType(_)) => true,
            Some(T::OptionalType(o)) => matches!(
                o.elem_type.as_deref().and_then(|t| t.value.as_ref()),
                Some(T::SequenceType(_))
            ),
            _ => false,
        })
}
