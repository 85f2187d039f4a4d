//! The device plugin API, after OpenVINO's plugin API, kept
//! small: identity and metrics, validated configuration, QueryNetwork,
//! compilation into [`CompiledSubgraph`]s that run infer requests (several
//! at once), export/import of compiled subgraphs, and per-node performance
//! counters.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;

use tessera_common::onnx::proto::{
    tensor_shape_proto::dimension, type_proto, ModelProto, ValueInfoProto,
};
use tessera_common::onnx::ElemType;
use tessera_common::tensor::{Tensor, Value};

/// Errors of plugins and compiled subgraphs.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("{plugin} cannot run here: {reason}")]
    Unavailable { plugin: String, reason: String },
    #[error("unknown metric '{name}'; supported: {supported}")]
    UnknownMetric { name: String, supported: String },
    #[error("unsupported config key '{key}'; supported: {supported}")]
    UnknownConfigKey { key: String, supported: String },
    #[error("bad value '{value}' for config key {key}; allowed: {allowed}")]
    BadConfigValue {
        key: String,
        value: String,
        allowed: String,
    },
    #[error("invalid model: {0}")]
    InvalidModel(String),
    #[error("{backend} cannot compile this subgraph: {reason}")]
    Compile { backend: String, reason: String },
    #[error("bad inputs: {0}")]
    BadInput(String),
    #[error("inference failed: {0}")]
    Infer(String),
    #[error("cannot import blob: {0}")]
    Import(String),
}

/// A metric's value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricValue {
    Text(String),
    List(Vec<String>),
    /// RANGE_FOR_ASYNC_INFER_REQUESTS: (min, max, step).
    Range(u32, u32, u32),
    Bool(bool),
    Number(f64),
}

impl std::fmt::Display for MetricValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricValue::Text(s) => f.write_str(s),
            MetricValue::List(v) => f.write_str(&v.join(", ")),
            MetricValue::Range(a, b, c) => write!(f, "{a}..{b} step {c}"),
            MetricValue::Bool(b) => f.write_str(if *b { "YES" } else { "NO" }),
            MetricValue::Number(n) => write!(f, "{n}"),
        }
    }
}

/// Metric names every plugin answers.
pub const METRICS: [&str; 11] = [
    "FULL_DEVICE_NAME",
    "AVAILABLE_DEVICES",
    "SUPPORTED_METRICS",
    "SUPPORTED_CONFIG_KEYS",
    "OPTIMIZATION_CAPABILITIES",
    "RANGE_FOR_ASYNC_INFER_REQUESTS",
    "IMPORT_EXPORT_SUPPORT",
    "DEVICE_ARCHITECTURE",
    // Ours, for the cost model (measured once, then cached).
    "GFLOPS",
    "MEMORY_BANDWIDTH_GBPS",
    // The memory it offers for models, bytes (0: not known).
    "MEMORY_BYTES",
];

pub use crate::plugin_config::{Config, ConfigKey, PerformanceHint};

/// A QueryNetwork answer: the nodes this device runs, and why not the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryResult {
    pub supported: BTreeSet<String>,
    pub unsupported: BTreeMap<String, String>,
    /// Element types and shapes (rank, dims where known) of intermediate
    /// tensors whose type or rank static inference could not tell, where
    /// the backend's own analysis of the whole model finds them: the
    /// planner declares subgraph boundaries with them instead of failing.
    pub types: BTreeMap<String, TensorSpec>,
}

impl QueryResult {
    /// Records one node's answer: supported, or why not.
    pub fn record(&mut self, node: String, outcome: Result<(), impl std::fmt::Display>) {
        match outcome {
            Ok(()) => {
                self.supported.insert(node);
            }
            Err(why) => {
                self.unsupported.insert(node, why.to_string());
            }
        }
    }
}

/// What a subgraph input or output holds: a tensor (nearly always), or a
/// sequence or optional of the spec's tensors, which only
/// [`CompiledSubgraph::infer_values`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ValueKind {
    #[default]
    Tensor,
    Sequence,
    OptionalTensor,
    OptionalSequence,
}

impl std::fmt::Display for ValueKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ValueKind::Tensor => "tensor",
            ValueKind::Sequence => "sequence of tensors",
            ValueKind::OptionalTensor => "optional tensor",
            ValueKind::OptionalSequence => "optional sequence of tensors",
        })
    }
}

/// Name, element type and shape of a subgraph input or output: `shape`
/// is `None` where the rank is unknown, a dim `None` where it is dynamic.
/// For a sequence or an optional (`kind`), `elem` and `shape` describe its
/// tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub elem: ElemType,
    pub shape: Option<Vec<Option<usize>>>,
    pub kind: ValueKind,
}

impl TensorSpec {
    /// The spec a model declares for a tensor; `None` if it is not a
    /// tensor of a known element type.
    pub fn from_value_info(v: &ValueInfoProto) -> Option<TensorSpec> {
        let Some(type_proto::Value::TensorType(t)) = v.r#type.as_ref()?.value.as_ref() else {
            return None;
        };
        let elem = ElemType(t.elem_type.filter(|&e| e != 0)?);
        let shape = t.shape.as_ref().map(|s| {
            s.dim
                .iter()
                .map(|d| match d.value {
                    Some(dimension::Value::DimValue(v)) => usize::try_from(v).ok(),
                    _ => None,
                })
                .collect()
        });
        Some(TensorSpec {
            name: v.name.clone().unwrap_or_default(),
            elem,
            shape,
            kind: ValueKind::Tensor,
        })
    }

    /// The spec as the planner reads a backend's own analysis of a type.
    pub fn reported_type(&self) -> tessera_common::plan::ReportedType {
        use tessera_common::graph::Dim;
        tessera_common::plan::ReportedType {
            elem: (self.elem.0 != 0).then_some(self.elem),
            shape: self.shape.as_ref().map(|dims| {
                dims.iter()
                    .map(|d| d.map_or(Dim::Unknown, |v| Dim::Known(v as i64)))
                    .collect()
            }),
        }
    }

    /// `[1,3,?,?]`, or `[..]` for an unknown rank.
    pub fn shape_string(&self) -> String {
        match &self.shape {
            Some(dims) => {
                let dims: Vec<String> = dims
                    .iter()
                    .map(|d| d.map_or("?".into(), |v| v.to_string()))
                    .collect();
                format!("[{}]", dims.join(","))
            }
            None => "[..]".into(),
        }
    }

    /// Checks a request's tensor against the spec.
    pub fn check(&self, t: &Tensor) -> Result<(), PluginError> {
        if self.kind != ValueKind::Tensor {
            return Err(PluginError::BadInput(format!(
                "input '{}' is a {} of {}, not a tensor (run it with infer_values)",
                self.name, self.kind, self.elem
            )));
        }
        self.check_tensor(t)
    }

    /// Checks a request's value against the spec: its kind, then each of
    /// its tensors.
    pub fn check_value(&self, v: &Value) -> Result<(), PluginError> {
        let kind = |k: &str| {
            PluginError::BadInput(format!(
                "input '{}' must be a {} of {}, got {k}",
                self.name, self.kind, self.elem
            ))
        };
        match (self.kind, v) {
            (ValueKind::Tensor | ValueKind::OptionalTensor, Value::Tensor(t)) => {
                self.check_tensor(t)
            }
            (ValueKind::Sequence | ValueKind::OptionalSequence, Value::Sequence { items, .. }) => {
                items.iter().try_for_each(|t| self.check_tensor(t))
            }
            (ValueKind::OptionalTensor | ValueKind::OptionalSequence, Value::Optional(inner)) => {
                match inner.as_deref() {
                    None => Ok(()),
                    Some(Value::Optional(_)) => Err(kind("an optional of an optional")),
                    Some(inner) => self.check_value(inner),
                }
            }
            (_, other) => Err(kind(&other.to_string())),
        }
    }

    fn check_tensor(&self, t: &Tensor) -> Result<(), PluginError> {
        let fits = self.shape.as_ref().is_none_or(|dims| {
            t.shape().len() == dims.len()
                && t.shape()
                    .iter()
                    .zip(dims)
                    .all(|(&d, s)| s.is_none_or(|s| s == d))
        });
        if t.elem() != self.elem {
            return Err(PluginError::BadInput(format!(
                "input '{}' must be {}, got {}",
                self.name,
                self.elem,
                t.elem()
            )));
        }
        if !fits {
            return Err(PluginError::BadInput(format!(
                "input '{}' must have shape {}, got {:?}",
                self.name,
                self.shape_string(),
                t.shape()
            )));
        }
        Ok(())
    }
}

/// Checks a request's inputs against a compiled subgraph's specs: their
/// count, then each one's element type and shape.
pub fn check_inputs(specs: &[TensorSpec], inputs: &[Tensor]) -> Result<(), PluginError> {
    check_count(specs, inputs.len())?;
    inputs
        .iter()
        .zip(specs)
        .try_for_each(|(t, spec)| spec.check(t))
}

/// A request holds one input per spec.
fn check_count(specs: &[TensorSpec], given: usize) -> Result<(), PluginError> {
    if given == specs.len() {
        return Ok(());
    }
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    Err(PluginError::BadInput(format!(
        "expected {} inputs ({}), got {given}",
        names.len(),
        names.join(", ")
    )))
}

/// [`check_inputs`] for graph values.
pub fn check_values(specs: &[TensorSpec], inputs: &[Value]) -> Result<(), PluginError> {
    check_count(specs, inputs.len())?;
    inputs
        .iter()
        .zip(specs)
        .try_for_each(|(v, spec)| spec.check_value(v))
}

/// What happened to an original node in a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecStatus {
    Executed,
    NotRun,
    OptimizedOut,
}

/// A per-node performance counter, as in OpenVINO's `-pc` output.
#[derive(Debug, Clone, PartialEq)]
pub struct PerfCounter {
    pub node: String,
    pub op_type: String,
    pub status: ExecStatus,
    pub real_us: u64,
    pub cpu_us: u64,
    pub exec_type: String,
}

impl std::fmt::Display for PerfCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = match self.status {
            ExecStatus::Executed => "EXECUTED",
            ExecStatus::NotRun => "NOT_RUN",
            ExecStatus::OptimizedOut => "OPTIMIZED_OUT",
        };
        write!(
            f,
            "{}: {status} layerType: {} realTime: {} cpu: {} execType: {}",
            self.node, self.op_type, self.real_us, self.cpu_us, self.exec_type
        )
    }
}

/// Outputs of one request, and its counters when PERF_COUNT is YES.
#[derive(Debug, Clone)]
pub struct InferResult {
    pub outputs: Vec<Tensor>,
    pub counters: Vec<PerfCounter>,
}

/// A subgraph compiled for one device. `infer` may be called from several
/// threads at once, up to RANGE_FOR_ASYNC_INFER_REQUESTS.
pub trait CompiledSubgraph: Send + Sync {
    fn inputs(&self) -> &[TensorSpec];
    fn outputs(&self) -> &[TensorSpec];
    /// Runs one request; inputs in [`CompiledSubgraph::inputs`] order.
    fn infer(&self, inputs: &[Tensor]) -> Result<InferResult, PluginError>;
    /// Runs one request of graph values: what a subgraph whose inputs or
    /// outputs are sequences or optionals takes and returns. A backend that
    /// carries only tensors runs it through [`CompiledSubgraph::infer`].
    fn infer_values(&self, inputs: &[Value]) -> Result<Vec<Value>, PluginError> {
        let tensors = inputs
            .iter()
            .zip(self.inputs())
            .map(|(v, spec)| {
                v.as_tensor().cloned().ok_or_else(|| {
                    PluginError::BadInput(format!(
                        "input '{}' is a {v}; this backend carries tensors only",
                        spec.name
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let result = self.infer(&tensors)?;
        Ok(result.outputs.into_iter().map(Value::Tensor).collect())
    }
    /// A blob that [`DevicePlugin::import`] turns back into this subgraph,
    /// as pieces to write one after another (the model it holds is not
    /// copied into one buffer).
    fn export(&self) -> Result<Vec<Bytes>, PluginError>;
}

/// A device plugin: one compute backend.
pub trait DevicePlugin: Send + Sync {
    /// The device kind, e.g. `CPU`.
    fn name(&self) -> &str;
    /// Devices of this kind here, e.g. `["CPU.0"]`.
    fn available_devices(&self) -> Vec<String>;
    /// A metric by name (see [`METRICS`]); unknown names are an error.
    fn metric(&self, name: &str) -> Result<MetricValue, PluginError>;
    /// Sets a plugin-wide config value (see [`ConfigKey`]).
    fn set_config(&self, key: &str, value: &str) -> Result<(), PluginError>;
    /// The plugin-wide configuration.
    fn config(&self) -> Config;
    /// The nodes of `model` (by name) this device can run, after its own
    /// transformations; housekeeping (inputs, initializers, outputs) is not
    /// listed.
    fn query_network(&self, model: &ModelProto) -> Result<QueryResult, PluginError>;
    /// Compiles an exported subgraph (ONNX bytes); `config` overrides the
    /// plugin-wide configuration for this subgraph. A backend that keeps
    /// the model keeps these bytes (a shared buffer), not a copy.
    fn compile(
        &self,
        onnx: &Bytes,
        config: &Config,
    ) -> Result<Arc<dyn CompiledSubgraph>, PluginError>;
    /// Restores an exported compiled subgraph; a blob made by another
    /// device, backend version or configuration is an error.
    fn import(&self, blob: &Bytes) -> Result<Arc<dyn CompiledSubgraph>, PluginError>;
    /// [`import`](Self::import) of a blob that is the whole of `file`,
    /// mapped (the compile cache's): a backend may read the file itself,
    /// which stays as it is while the subgraph is alive (removing it keeps
    /// what is open of it).
    fn import_file(
        &self,
        blob: &Bytes,
        file: &std::path::Path,
    ) -> Result<Arc<dyn CompiledSubgraph>, PluginError> {
        let _ = file;
        self.import(blob)
    }
}

/// The header of an exported blob: `TSRBLOB1`, a length-prefixed text
/// header `device|backend|version|k=v;k=v`, then the payload.
pub mod blob {
    use bytes::Bytes;

    use super::{Config, PluginError};

    const MAGIC: &[u8] = b"TSRBLOB1";

    /// The blob as two pieces: its header, and `payload` itself (shared).
    pub fn write(
        device: &str,
        backend: &str,
        version: &str,
        config: &Config,
        payload: &Bytes,
    ) -> Vec<Bytes> {
        write_pieces((device, backend, version), config, [payload.clone()])
    }

    /// The blob as pieces: its header, then the payload's pieces.
    pub fn write_pieces(
        (device, backend, version): (&str, &str, &str),
        config: &Config,
        payload: impl IntoIterator<Item = Bytes>,
    ) -> Vec<Bytes> {
        let cfg: Vec<String> = config.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let header = format!("{device}|{backend}|{version}|{}", cfg.join(";"));
        let mut out = Vec::with_capacity(MAGIC.len() + 4 + header.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        std::iter::once(Bytes::from(out)).chain(payload).collect()
    }

    /// The blob the pieces of an export make, in one buffer.
    pub fn join(pieces: &[Bytes]) -> Bytes {
        let mut out = Vec::with_capacity(pieces.iter().map(Bytes::len).sum());
        pieces.iter().for_each(|p| out.extend_from_slice(p));
        Bytes::from(out)
    }

    /// Checks the header against what this plugin would write and returns
    /// the configuration and payload.
    pub fn read(
        blob: &Bytes,
        device: &str,
        backend: &str,
        version: &str,
    ) -> Result<(Config, Bytes), PluginError> {
        let err = |m: String| PluginError::Import(m);
        if blob.len() < MAGIC.len() + 4 || &blob[..MAGIC.len()] != MAGIC {
            return Err(err("not a Tessera compiled-subgraph blob".into()));
        }
        let len = u32::from_le_bytes([blob[8], blob[9], blob[10], blob[11]]) as usize;
        let header = blob
            .get(12..12usize.saturating_add(len))
            .and_then(|h| std::str::from_utf8(h).ok())
            .ok_or_else(|| err("truncated or garbled header".into()))?;
        let parts: Vec<&str> = header.splitn(4, '|').collect();
        let [d, b, v, cfg] = parts[..] else {
            return Err(err("garbled header".into()));
        };
        if (d, b, v) != (device, backend, version) {
            return Err(err(format!(
                "made by {d} on {b} {v}; this is {device} on {backend} {version}"
            )));
        }
        let mut config = Config::default();
        for kv in cfg.split(';').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| err(format!("bad config entry '{kv}'")))?;
            config.set(k, v)?;
        }
        Ok((config, blob.slice(12 + len..)))
    }
}
