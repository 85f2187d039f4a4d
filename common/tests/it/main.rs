//! The graph IR's integration tests, one binary: partitioning (seeds and
//! properties), placement and memory, affinity cost, simplification,
//! control flow, malformed models, real models, state pairs, tensors and
//! the wire protocol (shared-memory payloads included).

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod util;

mod affinity_cost;
mod control_flow;
mod malformed;
mod memory;
mod partition_props;
mod partition_seeds;
mod placement;
mod real_models;
mod shared;
mod simplify;
mod state;
mod tensor_interop;
mod wire;
