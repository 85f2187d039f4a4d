//! Scheduling a network over a cluster: how many copies (replicas) of it
//! run, on which hosts, each copy planned (and possibly split into
//! pipelined stages) over its hosts' devices, and the throughput the cost
//! model predicts. Pure: the coordinator calls it with its workers'
//! figures, [`simulate`] with 1,000 generated ones.
//!
//! Copies get disjoint host groups, dealt by capacity ([`groups::deal`]),
//! while there are hosts enough; more copies than hosts share them. A
//! copy's throughput is one request per its busiest device's time per
//! request ([`predict`]); copies on disjoint hosts add up. `auto` plans
//! every count of copies from [`groups::candidate_counts`] and keeps the
//! one with the most predicted throughput (the fewest copies among those
//! within 1% of it): on two equal workers two whole copies beat a
//! two-stage pipeline whenever the split's transfers cost more than its
//! stages' imbalance saves.
//!
//! # Example
//!
//! ```
//! use std::collections::HashMap;
//! use tessera_common::affinity::{AnalyticCostModel, DeviceId, DevicePriority, SupportSet};
//! use tessera_common::graph::Graph;
//! use tessera_common::plan::PlanOptions;
//! use tessera_common::schedule::{schedule, Cluster, Replicas};
//!
//! let graph = Graph::from_model(tessera_common::synth::small_cnn(1))?;
//! let devices = vec![DeviceId::parse("a/CPU")?, DeviceId::parse("b/CPU")?];
//! let supports: HashMap<DeviceId, SupportSet> =
//!     devices.iter().map(|d| (d.clone(), SupportSet::all())).collect();
//! let cost = AnalyticCostModel::default();
//! let options = PlanOptions { priority: DevicePriority { devices }, ..Default::default() };
//! let cluster = Cluster { graph: &graph, supports: &supports, cost: &cost };
//! let planned = schedule(&cluster, &options, Replicas::Auto)?;
//! assert_eq!(planned.copies.len(), 2); // a whole copy on each worker
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod groups;
pub mod predict;
pub mod simulate;

use std::collections::{BTreeMap, HashMap};

use crate::affinity::{AnalyticCostModel, DeviceId, SupportSet};
use crate::graph::Graph;
use crate::plan::{plan, Plan, PlanError, PlanOptions};
use predict::{copy_cost, CopyCost};

/// How many copies of a network to run. Written and read as `auto` or a
/// number (config files, JSON, the wire alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Replicas {
    Count(u32),
    /// As many, and as split, as the cost model predicts gives the most
    /// throughput.
    Auto,
}

impl Default for Replicas {
    fn default() -> Self {
        Replicas::Count(1)
    }
}

impl std::str::FromStr for Replicas {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(Replicas::Auto),
            n => match n.parse::<u32>() {
                Ok(0) => Err("replicas must be at least 1 (or auto)".into()),
                Ok(n) => Ok(Replicas::Count(n)),
                Err(_) => Err(format!(
                    "replicas '{n}' is neither a number of copies nor auto"
                )),
            },
        }
    }
}

impl TryFrom<String> for Replicas {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Replicas> for String {
    fn from(r: Replicas) -> String {
        r.to_string()
    }
}

impl std::fmt::Display for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Replicas::Count(n) => write!(f, "{n}"),
            Replicas::Auto => f.write_str("auto"),
        }
    }
}

/// What scheduling needs to know of the cluster.
pub struct Cluster<'a> {
    /// The network, prepared for planning.
    pub graph: &'a Graph,
    /// What each device can run (QueryNetwork's answers).
    pub supports: &'a HashMap<DeviceId, SupportSet>,
    pub cost: &'a AnalyticCostModel,
}

/// One copy of the network.
#[derive(Debug, Clone)]
pub struct Copy {
    /// The hosts it may use (its plan may leave some idle).
    pub hosts: Vec<String>,
    pub plan: Plan,
    pub cost: CopyCost,
}

/// One count of copies `auto` weighed.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Considered {
    pub copies: usize,
    /// Predicted requests per second; `None` when it could not be planned.
    pub predicted_rps: Option<f64>,
    /// Why not, when it could not be planned.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// The copies to deploy.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub copies: Vec<Copy>,
    /// Predicted requests per second of all copies together.
    pub predicted_rps: f64,
    /// `auto`'s candidates, in the order weighed (empty for a count).
    pub considered: Vec<Considered>,
}

/// Why a network cannot be scheduled as asked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    #[error("no device to run on")]
    NoDevices,
    #[error("replica {index} of {count} (on {hosts}) cannot be planned: {source}")]
    Copy {
        index: usize,
        count: usize,
        hosts: String,
        #[source]
        source: PlanError,
    },
    #[error(
        "{count} replicas do not fit: {device} would hold {copies} of them, \
         needing {} in all, but offers {}",
        crate::memory::format_size(*.need),
        crate::memory::format_size(*.have)
    )]
    Memory {
        count: usize,
        device: String,
        copies: usize,
        need: u64,
        have: u64,
    },
    #[error("no number of replicas can be planned on this cluster: {0}")]
    NoCandidate(String),
}

/// Schedules the network as `replicas` copies; `options.priority` lists
/// every device the copies may use.
pub fn schedule(
    cluster: &Cluster,
    options: &PlanOptions,
    replicas: Replicas,
) -> Result<Schedule, ScheduleError> {
    let hosts = groups::hosts(&options.priority.devices, cluster.cost);
    if hosts.is_empty() {
        return Err(ScheduleError::NoDevices);
    }
    match replicas {
        Replicas::Count(n) => {
            let n = (n as usize).max(1);
            let groups = groups::deal(&hosts, n);
            let planned = plan_groups(cluster, options, &groups)?;
            let predicted_rps = planned.iter().map(|c| c.cost.throughput_rps()).sum();
            let copies: Vec<Copy> = (0..n).map(|i| planned[i % planned.len()].clone()).collect();
            check_memory(options, &copies)?;
            Ok(Schedule {
                copies,
                predicted_rps,
                considered: Vec::new(),
            })
        }
        Replicas::Auto => auto(cluster, options, &hosts),
    }
}

/// Plans every count of copies `auto` weighs and keeps the best.
fn auto(
    cluster: &Cluster,
    options: &PlanOptions,
    hosts: &[(String, f64)],
) -> Result<Schedule, ScheduleError> {
    let mut considered = Vec::new();
    let mut best: Option<(f64, Vec<Copy>)> = None;
    let mut first_error = None;
    for k in groups::candidate_counts(hosts.len()) {
        let groups = groups::deal(hosts, k);
        let planned = plan_groups(cluster, options, &groups).and_then(|copies| {
            check_memory(options, &copies)?;
            Ok(copies)
        });
        match planned {
            Ok(copies) => {
                let rps: f64 = copies.iter().map(|c| c.cost.throughput_rps()).sum();
                considered.push(Considered {
                    copies: k,
                    predicted_rps: Some(rps),
                    note: String::new(),
                });
                // More copies only when they predict over 1% more.
                if best.as_ref().is_none_or(|(b, _)| rps > b * 1.01) {
                    best = Some((rps, copies));
                }
            }
            Err(e) => {
                considered.push(Considered {
                    copies: k,
                    predicted_rps: None,
                    note: e.to_string(),
                });
                first_error.get_or_insert(e);
            }
        }
    }
    match best {
        Some((predicted_rps, copies)) => Ok(Schedule {
            copies,
            predicted_rps,
            considered,
        }),
        None => Err(ScheduleError::NoCandidate(
            first_error.map(|e| e.to_string()).unwrap_or_default(),
        )),
    }
}

/// Plans one copy per host group.
fn plan_groups(
    cluster: &Cluster,
    options: &PlanOptions,
    groups: &[Vec<String>],
) -> Result<Vec<Copy>, ScheduleError> {
    groups
        .iter()
        .enumerate()
        .map(|(index, hosts)| {
            let copy_options = within(options, hosts);
            let supports: HashMap<DeviceId, SupportSet> = copy_options
                .priority
                .devices
                .iter()
                .filter_map(|d| Some((d.clone(), cluster.supports.get(d)?.clone())))
                .collect();
            let plan =
                plan(cluster.graph, &supports, cluster.cost, &copy_options).map_err(|source| {
                    ScheduleError::Copy {
                        index: index + 1,
                        count: groups.len(),
                        hosts: short_list(hosts),
                        source,
                    }
                })?;
            let cost = copy_cost(cluster.graph, &plan, cluster.cost);
            Ok(Copy {
                hosts: hosts.clone(),
                plan,
                cost,
            })
        })
        .collect()
}

/// Up to eight names, then how many more.
fn short_list(names: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut text = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// `options` restricted to the devices of `hosts`; manual pins naming
/// other hosts are dropped (those nodes fall to the policy).
fn within(options: &PlanOptions, hosts: &[String]) -> PlanOptions {
    let inside = |d: &DeviceId| hosts.contains(&d.host.clone().unwrap_or_default());
    let mut out = options.clone();
    out.priority.devices.retain(inside);
    out.manual.retain(|_, d| d.host.is_none() || inside(d));
    out
}

/// Every device with a limit holds what all the copies placed on it need
/// (copies sharing a host each hold their own weights).
fn check_memory(options: &PlanOptions, copies: &[Copy]) -> Result<(), ScheduleError> {
    let mut need: BTreeMap<&str, (u64, usize)> = BTreeMap::new();
    for copy in copies {
        for d in &copy.plan.memory.devices {
            let entry = need.entry(d.device.as_str()).or_default();
            entry.0 = entry.0.saturating_add(d.need.total());
            entry.1 += 1;
        }
    }
    let limits: HashMap<String, u64> = options
        .memory
        .iter()
        .map(|(d, &b)| (d.to_string(), b))
        .collect();
    for (device, (bytes, copies_on)) in need {
        if let Some(&have) = limits.get(device) {
            if bytes > have {
                return Err(ScheduleError::Memory {
                    count: copies.len(),
                    device: device.to_string(),
                    copies: copies_on,
                    need: bytes,
                    have,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
