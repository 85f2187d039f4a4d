//! `tessera-common`: Tessera's core, free of I/O on the hot path and of any
//! async runtime (like `quinn-proto`), so everything here is testable with
//! plain unit and property tests.
//!
//! Layout:
//! - [`onnx`]: ONNX model I/O on prost types generated from the vendored
//!   upstream `onnx-ml.proto` (lossless round trip, external data).
//! - [`graph`]: the IR on petgraph: one node per ONNX node plus Parameter /
//!   Constant / Result housekeeping nodes; tensor edges with element type
//!   and static shape where known.
//! - [`affinity`]: device names and priority strings, support sets, the
//!   priority and cost policies, manual affinity, strict mode, explanations.
//! - [`partition`]: subgraph selection (`fast`, `reference`), the merge
//!   pass and the validator.
//! - [`export`]: each subgraph as a standalone ONNX model.
//! - [`ops`]: one entry per op type joining its rules (types, shapes,
//!   folding, decomposition, cost), which live in files by op family.
//! - [`decompose`]: ops a backend lacks rewritten as standard ONNX ops (a
//!   plugin's transformations before QueryNetwork and compilation).
//! - [`declined`]: why a rule (a decomposition, a backend's lowering or
//!   probe) does not handle a node, as a typed reason.
//! - [`memory`]: sizes, what nodes need in memory on a device (weights,
//!   activations, state), and the placement that cuts a model too big for
//!   one device into pipelined stages that each fit.
//! - [`models`]: a named model's settings (`[models.NAME]`, an HTTP
//!   load's config) and the load request they make.
//! - [`plan`]: affinity, partition and export in one call (HETERO and the
//!   coordinator), and the check of a request's inputs.
//! - [`serving`]: a front door's settings (`[serving]`).
//! - [`schedule`]: how many copies of a network run, on which hosts, and
//!   the throughput the cost model predicts (also over 1,000 simulated
//!   workers).
//! - [`dump`]: GraphViz and JSON dumps of the decisions.
//! - [`tensor`]: dense tensors as bytes, from and to ONNX `TensorProto` and
//!   NumPy `.npy`.
//! - [`wire`]: the wire protocol (frames, handshake, control messages,
//!   routing tables, the data channel, tensor frames, limits), without
//!   sockets.
//! - [`requests`]: a request's tries and one try in flight, as pure state
//!   machines the requester drives.
//! - [`generation`]: sampling at the logits, continuous batching and the
//!   release of generated text (pure state machines).
//! - [`synth`]: synthetic models and random DAGs for tests and benchmarks.
//!
//! # Example
//!
//! ```
//! use std::collections::{BTreeMap, HashMap};
//! use tessera_common::affinity::{assign, AffinityRequest, AnalyticCostModel, DeviceId, DevicePriority, Policy, SupportSet};
//! use tessera_common::graph::Graph;
//! use tessera_common::partition::{partition, PartitionOptions};
//! use tessera_common::synth::{model_from_dag, Dag};
//!
//! // a → b → c → d and b → d; the GPU cannot run c.
//! let dag = Dag { nodes: 4, edges: vec![(0, 1), (1, 2), (2, 3), (1, 3)] };
//! let graph = Graph::from_model(model_from_dag(&dag, Some(&["a", "b", "c", "d"])))?;
//! let priority = DevicePriority::parse("HETERO:GPU,CPU")?;
//! let supports = HashMap::from([
//!     (DeviceId::parse("GPU")?, SupportSet::from_nodes(["a", "b", "d"])),
//!     (DeviceId::parse("CPU")?, SupportSet::all()),
//! ]);
//! let cost_model = AnalyticCostModel::default();
//! let assignment = assign(&graph, &AffinityRequest {
//!     priority: &priority,
//!     supports: &supports,
//!     manual: &BTreeMap::new(),
//!     policy: Policy::Priority,
//!     strict: true,
//!     cost_model: &cost_model,
//! })?;
//! let plan = partition(&graph, &assignment, PartitionOptions::default())?;
//! // [a, b] on GPU, [c] on CPU, [d] on GPU: never [a, b, d] + [c], a cycle.
//! assert_eq!(plan.subgraphs.len(), 3);
//! let models = tessera_common::export::export_all(&graph, &plan)?;
//! assert_eq!(models.len(), 3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod affinity;
pub mod backoff;
pub mod declined;
pub mod decompose;
pub mod dump;
pub mod export;
pub mod generation;
pub mod graph;
pub mod memory;
pub mod models;
pub mod onnx;
pub mod ops;
pub mod partition;
pub mod plan;
pub mod requests;
pub mod schedule;
pub mod serving;
pub mod simplify;
pub mod synth;
pub mod tensor;
pub mod wire;
