//! Tessera worker: hosts device plugins (one per compute backend), answers
//! QueryNetwork, compiles the subgraphs it is given and runs them.
//!
//! Layout: [`plugin`] is the `DevicePlugin` API; [`plugins`] holds one
//! folder per backend (`plugins/onnxruntime`, `plugins/cpu` on tract,
//! `plugins/gpu` on wgpu), the registry, and `plugins::support` (which
//! backends run each op type);
//! [`hetero`] runs a model split across plugins in one process;
//! [`daemon`] serves the plugins to a cluster (registration, QueryNetwork,
//! deployment, one actix actor per subgraph, worker-to-worker streaming);
//! [`memory`] reads the machine's memory (for plugins and daemon alike);
//! [`conformance`] is the ONNX node-test suite written once against
//! `&dyn DevicePlugin`; [`crash`] prints every thread's backtrace when the
//! process dies of a fatal signal. See `docs/plugins.md`.
//!
//! ```no_run
//! use tessera_worker::plugins;
//! let cpu = plugins::create("CPU")?;
//! let compiled = cpu.compile(&std::fs::read("subgraph_0.onnx")?.into(), &Default::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod conformance;
#[cfg(target_os = "linux")]
pub mod crash;
pub mod daemon;
pub mod hetero;
pub mod memory;
pub mod plugin;
pub mod plugin_config;
pub mod plugins;
