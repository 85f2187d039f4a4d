//! Planning a network: the devices a load names, QueryNetwork fanned out
//! to their workers concurrently, the cost model from the workers' metrics
//! and measured links, then its copies scheduled (one by default; see
//! `tessera_common::schedule`), each with affinity and partition over
//! `host/DEVICE` devices, and the plan document clients get.
//!
//! By job: `devices` (the devices a load names), `query` (QueryNetwork
//! fan-out), `cost` (the cost model), `memory` (what devices hold and may
//! still take), `prepare` (a request simplified, typed and given its
//! options), `copies` (its copies scheduled), `report` (the plan document,
//! dry runs).

mod copies;
mod cost;
mod devices;
mod memory;
mod prepare;
mod query;
mod report;

pub(crate) use copies::{plan_request, Planned};
pub(crate) use memory::memory_needs;
pub(crate) use prepare::{rebuild_graph, Scope};
pub use query::query;
pub(crate) use query::ByHost;
pub use report::dry_run;
pub(crate) use report::{hosts_of, plan_report_of};
