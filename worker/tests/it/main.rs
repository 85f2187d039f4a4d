//! The worker's integration tests, one binary (one link, one copy of the
//! backends on disk): the plugin conformance suite for every backend, the
//! onnxruntime library and plugin, the GPU kernels, HETERO runs on real
//! models, corpus cuts and the daemon's config. `onnxruntime_library.rs`
//! stays a binary of its own: it needs a process where no onnxruntime
//! library was loaded yet.

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

mod conformance_cpu;
mod conformance_gpu;
mod conformance_onnxruntime;
mod corpus_cuts;
mod cpu_plugin;
mod crash_report;
mod daemon_config;
mod gpu_half;
mod gpu_kernels;
mod hetero_gpu;
mod hetero_models;
mod onnxruntime_plugin;
mod onnxruntime_values;
mod query_skeleton;
