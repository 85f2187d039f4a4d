//! Memory: sizes as people write them ([`parse_size`], [`format_size`]),
//! what running nodes on a device needs ([`NeedModel`], [`MemoryNeed`]:
//! weights, activations at the largest batch, per-sequence state), and the
//! placement that cuts a model too big for one device into pipelined
//! stages that each fit ([`mod@pipeline`]).
//!
//! # Example
//!
//! ```
//! use std::collections::BTreeMap;
//! use tessera_common::graph::Graph;
//! use tessera_common::memory::{parse_size, NeedModel};
//!
//! // 4 layers of 64×64 f32 weights (16 KiB each).
//! let graph = Graph::from_model(tessera_common::synth::matmul_chain(4, 64, 1))?;
//! let need = NeedModel::new(&graph, 1, &BTreeMap::new());
//! let all = need.subgraph_need(graph.topo_ops(), &graph.outputs);
//! assert_eq!(all.weights, 4 * parse_size("16KiB")?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod need;
pub mod pipeline;
mod size;

pub use need::{MemoryNeed, NeedModel};
pub use pipeline::{keep, pipeline, FitError, FitRequest, Pipeline, PipelineStage};
pub use size::{format_size, parse_limit, parse_size, SizeError};
