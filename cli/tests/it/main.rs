//! The CLI's end-to-end tests: the `tessera`, `coordinator` and `worker`
//! binaries as users run them, checked against onnxruntime,
//! onnxruntime-genai and llama.cpp. Each module is one subject (its own
//! `//!` says what it checks); `util` holds what they share.
//!
//! They are one test binary, not one per file: each file as its own binary
//! compiled `util` again and linked the whole workspace again, and the 23
//! binaries took 12 minutes of a CI build on two cores (this one about a
//! minute). Run one subject with its module's name as the filter, e.g.
//! `cargo test -p tessera-cli --test it -- hosts_apart::`.
//!
//! Tests of different modules run side by side (the harness's threads), as
//! those of one module always did; their scratch folders, namespaces and
//! ports are named so that they never meet.

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

mod certs_cli;
mod cluster_cli;
mod cluster_e2e;
mod cluster_faults;
mod cluster_memory;
mod cluster_refusals;
mod cluster_scale;
mod coordinator_ha;
mod coordinator_state;
mod corpus;
mod data_channel;
mod embeddings;
mod generate;
mod gguf;
mod gguf_families;
mod help;
mod hosts_apart;
mod kserve_http;
mod kserve_secure;
mod kubernetes;
mod main_job;
mod partition_cli;
mod run_cli;
mod web_page;
