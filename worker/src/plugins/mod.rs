//! The plugin registry: every backend this build knows, by device name.
//! Each backend sits behind a cargo feature; asking for one that was not
//! built says so.
//!
//! The CPU device has two backends: onnxruntime (feature `onnxruntime`,
//! the library loaded at run time) and tract (feature `cpu`, pure Rust).
//! By default ([`CpuBackend::Auto`]) onnxruntime serves it where its
//! library loads, tract otherwise (said once in the log); a forced backend
//! that cannot start is an error. The choice is process-wide, as
//! onnxruntime's library is: [`configure`] sets it before plugins are made.

#[cfg(feature = "cpu")]
pub mod cpu;
#[cfg(feature = "gpu")]
pub mod gpu;
#[cfg(feature = "onnxruntime")]
pub mod onnxruntime;
#[cfg(any(feature = "cpu", feature = "onnxruntime"))]
pub mod probe;
pub mod support;

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::plugin::{DevicePlugin, PluginError};

/// Device kinds this crate has backends for, and the cargo features that
/// provide them.
pub const BACKENDS: [(&str, &str); 2] = [("CPU", "onnxruntime' or 'cpu"), ("GPU", "gpu")];

/// Which backend serves the CPU device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CpuBackend {
    /// onnxruntime where its library loads, tract otherwise.
    #[default]
    Auto,
    Tract,
    OnnxRuntime,
}

/// A CPU backend name that is none of `auto`, `tract`, `onnxruntime`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown CPU backend '{0}'; known: auto, tract, onnxruntime")]
pub struct UnknownCpuBackend(pub String);

impl std::str::FromStr for CpuBackend {
    type Err = UnknownCpuBackend;
    fn from_str(s: &str) -> Result<CpuBackend, UnknownCpuBackend> {
        match s {
            "auto" => Ok(CpuBackend::Auto),
            "tract" => Ok(CpuBackend::Tract),
            "onnxruntime" => Ok(CpuBackend::OnnxRuntime),
            other => Err(UnknownCpuBackend(other.to_string())),
        }
    }
}

impl std::fmt::Display for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CpuBackend::Auto => "auto",
            CpuBackend::Tract => "tract",
            CpuBackend::OnnxRuntime => "onnxruntime",
        })
    }
}

/// How plugins are made in this process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginOptions {
    pub cpu_backend: CpuBackend,
    /// onnxruntime's shared library; `None`: `ORT_DYLIB_PATH`, then the
    /// installed Python package, then next to the executable.
    pub onnxruntime_library: Option<PathBuf>,
    /// Where a worker keeps what it measured of its CPU (its compile
    /// cache): see `remembered_calibration`.
    pub calibration_dir: Option<PathBuf>,
}

static OPTIONS: RwLock<Option<PluginOptions>> = RwLock::new(None);

/// Sets how plugins are made from now on in this process.
pub fn configure(options: PluginOptions) {
    if let Ok(mut o) = OPTIONS.write() {
        *o = Some(options);
    }
}

/// The options [`configure`] set (the defaults if it was not called).
pub fn options() -> PluginOptions {
    OPTIONS
        .read()
        .ok()
        .and_then(|o| o.clone())
        .unwrap_or_default()
}

/// Creates the plugin for a device kind (`CPU`, ...).
pub fn create(kind: &str) -> Result<Arc<dyn DevicePlugin>, PluginError> {
    create_named(kind, kind)
}

/// Creates the plugin for a device kind under another device name (a
/// second real instance, e.g. `CPU_B` to exercise HETERO on one machine).
pub fn create_named(kind: &str, name: &str) -> Result<Arc<dyn DevicePlugin>, PluginError> {
    match kind {
        "CPU" => cpu_plugin(name, &options()),
        #[cfg(feature = "gpu")]
        "GPU" => Ok(Arc::new(gpu::GpuPlugin::new()?)),
        other => {
            let reason = match BACKENDS.iter().find(|(k, _)| *k == other) {
                Some((_, feature)) => format!(
                    "this build has no {other} backend (not built with feature '{feature}')"
                ),
                None => {
                    let known: Vec<&str> = BACKENDS.iter().map(|(k, _)| *k).collect();
                    format!("unknown device kind; known: {}", known.join(", "))
                }
            };
            Err(PluginError::Unavailable {
                plugin: other.into(),
                reason,
            })
        }
    }
}

#[cfg(not(all(feature = "cpu", feature = "onnxruntime")))]
fn not_built(name: &str, feature: &str) -> PluginError {
    PluginError::Unavailable {
        plugin: name.into(),
        reason: format!("this build has no {feature} backend (not built with feature '{feature}')"),
    }
}

/// The CPU plugin `options` ask for.
pub fn cpu_plugin(
    name: &str,
    options: &PluginOptions,
) -> Result<Arc<dyn DevicePlugin>, PluginError> {
    match options.cpu_backend {
        CpuBackend::OnnxRuntime => onnxruntime_plugin(name, options),
        CpuBackend::Tract => tract_plugin(name),
        // A library named explicitly is asked for: its failure is an error.
        CpuBackend::Auto if options.onnxruntime_library.is_some() => {
            onnxruntime_plugin(name, options)
        }
        CpuBackend::Auto => match onnxruntime_plugin(name, options) {
            Ok(p) => Ok(p),
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| tracing::info!("CPU on tract-onnx: {e}"));
                tract_plugin(name)
            }
        },
    }
}

fn onnxruntime_plugin(
    name: &str,
    options: &PluginOptions,
) -> Result<Arc<dyn DevicePlugin>, PluginError> {
    #[cfg(feature = "onnxruntime")]
    {
        let library = options.onnxruntime_library.as_deref();
        Ok(Arc::new(onnxruntime::OrtPlugin::named(name, library)?))
    }
    #[cfg(not(feature = "onnxruntime"))]
    {
        let _ = options;
        Err(not_built(name, "onnxruntime"))
    }
}

fn tract_plugin(name: &str) -> Result<Arc<dyn DevicePlugin>, PluginError> {
    #[cfg(feature = "cpu")]
    {
        Ok(Arc::new(cpu::CpuPlugin::named(name)?))
    }
    #[cfg(not(feature = "cpu"))]
    {
        Err(not_built(name, "cpu"))
    }
}

/// The CPU's model name (from /proc/cpuinfo), for FULL_DEVICE_NAME.
#[cfg(any(feature = "cpu", feature = "onnxruntime"))]
pub(crate) fn cpu_model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH))
}

/// A metric of a CPU device, answered alike by both CPU backends:
/// `backend` names the backend in FULL_DEVICE_NAME (`tract-onnx 0.23`),
/// `calibrate` gives (GFLOPS, memory GB/s) and is called only when asked.
#[cfg(any(feature = "cpu", feature = "onnxruntime"))]
pub(crate) fn cpu_metric(
    device: &str,
    backend: &str,
    name: &str,
    calibrate: impl FnOnce() -> (f64, f64),
) -> Result<crate::plugin::MetricValue, PluginError> {
    use crate::plugin::{ConfigKey, MetricValue, METRICS};
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    Ok(match name {
        "FULL_DEVICE_NAME" => MetricValue::Text(format!("{} ({backend})", cpu_model_name())),
        "AVAILABLE_DEVICES" => MetricValue::List(vec![format!("{device}.0")]),
        "SUPPORTED_METRICS" => MetricValue::List(METRICS.iter().map(|s| s.to_string()).collect()),
        "SUPPORTED_CONFIG_KEYS" => {
            MetricValue::List(ConfigKey::ALL.map(|k| k.name().to_string()).to_vec())
        }
        "OPTIMIZATION_CAPABILITIES" => {
            MetricValue::List(vec!["FP32".into(), "FP16".into(), "INT8".into()])
        }
        "RANGE_FOR_ASYNC_INFER_REQUESTS" => MetricValue::Range(1, cores, 1),
        "IMPORT_EXPORT_SUPPORT" => MetricValue::Bool(true),
        "DEVICE_ARCHITECTURE" => MetricValue::Text(std::env::consts::ARCH.into()),
        "GFLOPS" => MetricValue::Number(calibrate().0),
        "MEMORY_BANDWIDTH_GBPS" => MetricValue::Number(calibrate().1),
        "MEMORY_BYTES" => {
            MetricValue::Number(crate::memory::available_memory().map_or(0.0, |b| b as f64))
        }
        other => {
            return Err(PluginError::UnknownMetric {
                name: other.into(),
                supported: METRICS.join(", "),
            });
        }
    })
}

/// The threads a CPU device computes a subgraph with (NUM_THREADS, 1 by
/// default, at most the machine's cores): its GFLOPS is the one-thread
/// figure measured once per process times this, so that a worker given
/// twice the threads is planned as twice as fast.
#[cfg(any(feature = "cpu", feature = "onnxruntime"))]
pub(crate) fn configured_threads(config: &crate::plugin::Config) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    config.num_threads().unwrap_or(1).clamp(1, cores) as f64
}

/// A CPU backend's one-thread GFLOPS and memory GB/s: read from the
/// worker's calibration folder (its compile cache) when an earlier run
/// measured them there, else measured by `measure` and written there. A
/// worker restarted on the same machine is then planned as it was: the
/// same cut, so its cached stages are used (measured again, under a
/// different load, its speed moved a re-plan's cut by a layer, and a stage
/// was shipped and compiled again).
#[cfg(any(feature = "cpu", feature = "onnxruntime"))]
pub(crate) fn remembered_calibration(
    backend: &str,
    measure: impl FnOnce() -> (f64, f64),
) -> (f64, f64) {
    let file = options()
        .calibration_dir
        .map(|dir| dir.join(format!("calibration-{backend}.txt")));
    let read = |path: &std::path::Path| -> Option<(f64, f64)> {
        let text = std::fs::read_to_string(path).ok()?;
        let (g, b) = text.trim().split_once(' ')?;
        let (g, b) = (g.parse::<f64>().ok()?, b.parse::<f64>().ok()?);
        (g > 0.0 && b > 0.0 && g.is_finite() && b.is_finite()).then_some((g, b))
    };
    if let Some(found) = file.as_deref().and_then(read) {
        tracing::info!(
            backend,
            gflops = found.0,
            gbps = found.1,
            "CPU speed as measured before (its calibration file)"
        );
        return found;
    }
    let measured = measure();
    if let Some(path) = file.filter(|_| measured.0 > 0.0 && measured.1 > 0.0) {
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, format!("{} {}\n", measured.0, measured.1)));
        if let Err(e) = written {
            tracing::debug!("calibration not kept in {}: {e}", path.display());
        }
    }
    measured
}

/// GFLOP/s of the fastest of `runs` calls of `run` (each `flops`
/// floating-point operations): other work on a shared machine only slows
/// a run down, so the fastest is the device's own speed, and a worker that
/// starts while its neighbours compute is not planned as a slow one.
#[cfg(any(feature = "cpu", feature = "onnxruntime"))]
pub(crate) fn fastest_gflops<E>(
    flops: f64,
    runs: usize,
    mut run: impl FnMut() -> Result<(), E>,
) -> Result<f64, E> {
    let mut best = std::time::Duration::MAX;
    for _ in 0..runs {
        let start = std::time::Instant::now();
        run()?;
        best = best.min(start.elapsed());
    }
    Ok(flops / best.as_secs_f64().max(1e-9) / 1e9)
}

/// Memory bandwidth (GB/s) of a 64 MiB copy, read and written.
#[cfg(any(feature = "cpu", feature = "onnxruntime"))]
pub(crate) fn memory_bandwidth_gbps() -> f64 {
    let src = vec![1u8; 64 << 20];
    let start = std::time::Instant::now();
    let copy = src.clone();
    let gbps = 2.0 * copy.len() as f64 / start.elapsed().as_secs_f64() / 1e9;
    std::hint::black_box(copy);
    gbps
}

/// The tensors of `graph` made by op nodes whose element type or rank
/// static inference left open: what a backend's own analysis is asked for.
#[cfg(any(feature = "cpu", feature = "onnxruntime"))]
pub(crate) fn untyped_intermediates(graph: &tessera_common::graph::Graph) -> Vec<&str> {
    graph
        .tensors
        .iter()
        .filter(|t| t.elem_type.is_none() || t.shape.is_none())
        .filter(|t| graph.node(t.producer).kind == tessera_common::graph::NodeKind::Op)
        .map(|t| t.name.as_str())
        .collect()
}
