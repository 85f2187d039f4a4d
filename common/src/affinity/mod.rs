//! Affinity: which device runs each op node.
//!
//! Inputs are a [`DevicePriority`], the per-device [`SupportSet`]s (what
//! QueryNetwork answered), an optional partial manual affinity and a
//! [`Policy`]. Rules, in order:
//! 1. a manual affinity wins (its device must support the node);
//! 2. `priority`: the first device in priority order that supports the node;
//!    `cost`: among the devices that support it, the cheapest by the
//!    [`CostModel`] (compute + transfer of inputs from other devices), ties
//!    broken by priority;
//! 3. a node no device supports is an error in strict mode; otherwise it goes
//!    with the nodes it reads from where they run on a device of the same
//!    kind as the last device of the priority list (the fallback device),
//!    else to the fallback device, and the explanation says so.
//!
//! Every placed node gets an [`Explanation`].

pub(crate) mod collections;
pub(crate) mod cost;
mod device;
mod manual;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

pub use cost::{
    op_work, tensor_bytes, AnalyticCostModel, CostModel, CostRule, DeviceProfile, LinkProfile,
    OpWork, DEFAULT_ELEM_BYTES, DEFAULT_NUMEL,
};
pub use device::{DeviceId, DeviceParseError, DevicePriority};
pub(crate) use manual::unplaced_why;
pub use manual::{parse_manual_affinity, ManualAffinity, Unplaced, UnplacedWhy};

use crate::graph::{Graph, Node, NodeId, NodeKind};

/// Index of a device in the priority list.
pub type DeviceIdx = u16;

/// Which nodes a device can run: every node, or the listed node names and
/// op types.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SupportSet {
    pub all: bool,
    pub nodes: HashSet<String>,
    pub op_types: HashSet<String>,
}

impl SupportSet {
    pub fn all() -> SupportSet {
        SupportSet {
            all: true,
            ..Default::default()
        }
    }

    /// Exactly these node names (a QueryNetwork answer).
    pub fn from_nodes<I: IntoIterator<Item = S>, S: Into<String>>(nodes: I) -> SupportSet {
        SupportSet {
            nodes: nodes.into_iter().map(Into::into).collect(),
            ..Default::default()
        }
    }

    pub fn contains(&self, node: &Node) -> bool {
        self.all || self.op_types.contains(&node.op_type) || self.nodes.contains(&node.name)
    }

    /// Parses a supports file: one entry per line, a node name or `op:TYPE`
    /// for every node of that type; blank lines and `#` comments are skipped.
    /// Node names must exist in `graph`.
    pub fn parse(text: &str, graph: &Graph, origin: &str) -> Result<SupportSet, AffinityError> {
        let mut set = SupportSet::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(op) = line.strip_prefix("op:") {
                set.op_types.insert(op.trim().to_string());
            } else if graph.onnx_node_by_name(line).is_some() {
                // Constant nodes may be listed; they follow their consumers.
                set.nodes.insert(line.to_string());
            } else {
                return Err(AffinityError::UnknownNode {
                    name: line.to_string(),
                    context: format!("{origin}, line {}", i + 1),
                });
            }
        }
        Ok(set)
    }
}

/// How to choose among several devices that support a node.
/// Written and read as its name (`priority`, `cost`), in config files, JSON
/// and on the wire alike; an unknown name is an error that lists both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Policy {
    /// First supporting device in priority order (OpenVINO's fallback policy).
    #[default]
    Priority,
    /// Cheapest supporting device by the cost model.
    Cost,
}

impl TryFrom<String> for Policy {
    type Error = String;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Policy> for String {
    fn from(p: Policy) -> String {
        p.to_string()
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "priority" => Ok(Policy::Priority),
            "cost" => Ok(Policy::Cost),
            other => Err(format!(
                "unknown policy '{other}' (expected priority or cost)"
            )),
        }
    }
}

/// Everything affinity assignment needs.
pub struct AffinityRequest<'a> {
    pub priority: &'a DevicePriority,
    /// One entry per device of the priority list.
    pub supports: &'a HashMap<DeviceId, SupportSet>,
    /// Partial manual affinity: node → device.
    pub manual: &'a BTreeMap<NodeId, DeviceId>,
    pub policy: Policy,
    pub strict: bool,
    pub cost_model: &'a dyn CostModel,
}

/// One device's estimate under the cost policy.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostEstimate {
    pub device: String,
    pub compute_us: f64,
    pub transfer_us: f64,
    pub total_us: f64,
}

/// The rule that placed a node.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "rule", rename_all = "lowercase")]
pub enum Rule {
    Manual,
    /// First supporting device; `rank` is its position in the priority list.
    Priority {
        rank: usize,
    },
    /// Cheapest device; all candidates' estimates, cheapest first.
    Cost {
        estimates: Vec<CostEstimate>,
    },
    /// No device supports the node; placed on the fallback device.
    Fallback,
    /// Computed from constants alone: placed with the nodes that read it
    /// (a weight made by `ConstantOfShape` is not sent every request).
    WithConsumers,
    /// Joined to other nodes by a sequence or an optional: placed on one
    /// device with them (such values do not cross devices).
    WithCollection,
    /// The policy's placement did not fit the devices' memory: the model
    /// was cut into pipelined stages that do; this node is in `stage`
    /// (1-based).
    Memory {
        stage: usize,
    },
}

/// Why a node runs where it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub node: NodeId,
    /// Devices whose support set contains the node, in priority order.
    pub supported_on: Vec<DeviceIdx>,
    pub device: DeviceIdx,
    pub rule: Rule,
}

/// The result of affinity assignment.
#[derive(Debug, Clone)]
pub struct Assignment {
    /// The priority list; [`DeviceIdx`] indexes it.
    pub devices: Vec<DeviceId>,
    /// Device of each node, indexed by `NodeId::index()`; `None` for
    /// housekeeping nodes.
    pub device_of: Vec<Option<DeviceIdx>>,
    /// One per op node, in topological order.
    pub explanations: Vec<Explanation>,
}

impl Assignment {
    pub fn device(&self, node: NodeId) -> Option<&DeviceId> {
        self.device_of[node.index()].map(|d| &self.devices[d as usize])
    }

    /// Human-readable explanation of one node.
    pub fn explain(&self, graph: &Graph, e: &Explanation) -> String {
        let node = graph.node(e.node);
        let supported: Vec<String> = e
            .supported_on
            .iter()
            .map(|&d| self.devices[d as usize].to_string())
            .collect();
        let device = &self.devices[e.device as usize];
        let why = match &e.rule {
            Rule::Manual => "manual affinity".to_string(),
            Rule::Priority { rank } => format!("priority (first supporting device, rank {rank})"),
            Rule::WithConsumers => {
                "computed from constants alone: placed with the nodes that read it".to_string()
            }
            Rule::WithCollection => {
                "joined to other nodes by a sequence or an optional: placed on one device with them".to_string()
            }
            Rule::Memory { stage } => format!(
                "memory (the policy's placement did not fit: pipelined stage {stage}, cut by memory and speed)"
            ),
            Rule::Fallback => {
                "fallback: no device supports it (placed with the nodes it reads from where they run on the fallback device's kind)".to_string()
            }
            Rule::Cost { estimates } => {
                let parts: Vec<String> = estimates
                    .iter()
                    .map(|c| {
                        format!(
                            "{}: {:.1} compute + {:.1} transfer = {:.1} µs",
                            c.device, c.compute_us, c.transfer_us, c.total_us
                        )
                    })
                    .collect();
                format!("cost ({})", parts.join("; "))
            }
        };
        format!(
            "{} [{}]: supported on [{}] -> {} by {}",
            node.name,
            node.op_type,
            supported.join(", "),
            device,
            why
        )
    }
}

/// Why affinity could not be assigned.
#[derive(Debug, thiserror::Error)]
pub enum AffinityError {
    #[error("unknown device '{device}' in {context}; the devices are: {known}")]
    UnknownDevice {
        device: String,
        context: String,
        known: String,
    },
    #[error("no node named '{name}' ({context})")]
    UnknownNode { name: String, context: String },
    #[error("manual affinity puts node '{node}' on {device}, which does not support it")]
    ManualUnsupported { node: String, device: String },
    #[error("strict mode: {} node(s) are supported by no device: {}", .nodes.len(), .nodes.join(", "))]
    Unsupported { nodes: Vec<String> },
    #[error("no support set given for device {0}")]
    MissingSupport(String),
    #[error("the priority list is empty")]
    NoDevices,
    #[error("affinity file: {0}")]
    BadFile(String),
    #[error("'{value}' is a sequence, an optional or a sequence's kept state, which does not cross devices: its makers and readers ({nodes}) must run on one device, but {why}")]
    SplitCollection {
        value: String,
        nodes: String,
        why: String,
    },
}

pub(crate) fn unknown_device(
    d: &DeviceId,
    context: &str,
    priority: &DevicePriority,
) -> AffinityError {
    let known: Vec<String> = priority.devices.iter().map(|d| d.to_string()).collect();
    AffinityError::UnknownDevice {
        device: d.to_string(),
        context: context.to_string(),
        known: known.join(", "),
    }
}

/// Assigns a device to every op node.
pub fn assign(graph: &Graph, req: &AffinityRequest<'_>) -> Result<Assignment, AffinityError> {
    let devices = req.priority.devices.clone();
    if devices.is_empty() {
        return Err(AffinityError::NoDevices);
    }
    let supports: Vec<&SupportSet> = devices
        .iter()
        .map(|d| {
            req.supports
                .get(d)
                .ok_or_else(|| AffinityError::MissingSupport(d.to_string()))
        })
        .collect::<Result<_, _>>()?;
    for d in req.supports.keys() {
        if req.priority.position(d).is_none() {
            return Err(unknown_device(d, "the support sets", req.priority));
        }
    }
    let mut device_of: Vec<Option<DeviceIdx>> = vec![None; graph.dag.node_count()];
    let mut explanations = Vec::with_capacity(graph.op_count());
    let mut unsupported = Vec::new();
    let fallback = (devices.len() - 1) as DeviceIdx;

    for &id in graph.topo_ops() {
        let node = graph.node(id);
        let supported_on: Vec<DeviceIdx> = (0..devices.len())
            .filter(|&d| supports[d].contains(node))
            .map(|d| d as DeviceIdx)
            .collect();
        let (device, rule) = if let Some(manual) = req.manual.get(&id) {
            let d = req.priority.position(manual).ok_or_else(|| {
                unknown_device(
                    manual,
                    &format!("manual affinity of node '{}'", node.name),
                    req.priority,
                )
            })? as DeviceIdx;
            if !supported_on.contains(&d) {
                return Err(AffinityError::ManualUnsupported {
                    node: node.name.clone(),
                    device: manual.to_string(),
                });
            }
            (d, Rule::Manual)
        } else if supported_on.is_empty() {
            unsupported.push(node.name.clone());
            (
                fallback_device(graph, id, &devices, &device_of, fallback),
                Rule::Fallback,
            )
        } else if req.policy == Policy::Cost && supported_on.len() > 1 {
            cheapest(
                graph,
                id,
                &supported_on,
                &devices,
                &device_of,
                req.cost_model,
            )
        } else {
            (
                supported_on[0],
                Rule::Priority {
                    rank: supported_on[0] as usize,
                },
            )
        };
        device_of[id.index()] = Some(device);
        explanations.push(Explanation {
            node: id,
            supported_on,
            device,
            rule,
        });
    }
    if req.strict && !unsupported.is_empty() {
        return Err(AffinityError::Unsupported { nodes: unsupported });
    }
    move_constant_nodes_to_consumers(graph, req, &supports, &mut device_of, &mut explanations);
    collections::keep_whole(graph, req, &supports, &mut device_of, &mut explanations)?;
    Ok(Assignment {
        devices,
        device_of,
        explanations,
    })
}

/// Nodes computed from constants alone (not manually placed) move to the
/// device of the nodes that read them, when those all run on one device
/// that supports them. Consumers are decided first (reverse topological
/// order), so a chain of such nodes moves together.
fn move_constant_nodes_to_consumers(
    graph: &Graph,
    req: &AffinityRequest<'_>,
    supports: &[&SupportSet],
    device_of: &mut [Option<DeviceIdx>],
    explanations: &mut [Explanation],
) {
    let mut constant_fed = vec![false; graph.dag.node_count()];
    for &id in graph.topo_ops() {
        let node = graph.node(id);
        constant_fed[id.index()] = node.all_inputs().all(|t| {
            let p = graph.tensor(t).producer;
            graph.node(p).kind == NodeKind::Constant || constant_fed[p.index()]
        }) && node.all_inputs().next().is_some();
    }
    let position: HashMap<NodeId, usize> = explanations
        .iter()
        .enumerate()
        .map(|(i, e)| (e.node, i))
        .collect();
    for &id in graph.topo_ops().iter().rev() {
        if !constant_fed[id.index()] || req.manual.contains_key(&id) {
            continue;
        }
        let node = graph.node(id);
        let mut targets = node
            .outputs
            .iter()
            .flatten()
            .flat_map(|&t| graph.tensor(t).consumers.iter())
            .map(|&c| device_of[c.index()]);
        let Some(Some(target)) = targets.next() else {
            continue;
        };
        let one_device = targets.all(|d| d == Some(target));
        if one_device
            && device_of[id.index()] != Some(target)
            && supports[target as usize].contains(node)
        {
            device_of[id.index()] = Some(target);
            if let Some(&i) = position.get(&id) {
                explanations[i].device = target;
                explanations[i].rule = Rule::WithConsumers;
            }
        }
    }
}

/// Where a node no device supports goes: with the nodes it reads from
/// when they run on a device of the fallback device's kind (two workers'
/// CPUs: the node stays in its neighbours' subgraph instead of becoming a
/// one-node subgraph on the last worker), else on the fallback device.
fn fallback_device(
    graph: &Graph,
    id: NodeId,
    devices: &[DeviceId],
    device_of: &[Option<DeviceIdx>],
    fallback: DeviceIdx,
) -> DeviceIdx {
    let kind = &devices[fallback as usize].name;
    graph
        .node(id)
        .all_inputs()
        .filter_map(|t| device_of[graph.tensor(t).producer.index()])
        .find(|&d| devices[d as usize].name == *kind)
        .unwrap_or(fallback)
}

fn cheapest(
    graph: &Graph,
    id: NodeId,
    candidates: &[DeviceIdx],
    devices: &[DeviceId],
    device_of: &[Option<DeviceIdx>],
    model: &dyn CostModel,
) -> (DeviceIdx, Rule) {
    let node = graph.node(id);
    let mut estimates: Vec<(DeviceIdx, CostEstimate)> = candidates
        .iter()
        .map(|&d| {
            let target = &devices[d as usize];
            let compute_us = model.compute_us(graph, id, target);
            let transfer_us: f64 = node
                .all_inputs()
                .filter_map(|t| {
                    let producer = graph.tensor(t).producer;
                    if graph.node(producer).kind != NodeKind::Op {
                        return None;
                    }
                    let from = &devices[device_of[producer.index()]? as usize];
                    Some(model.transfer_us(tensor_bytes(graph, t), from, target))
                })
                .sum();
            let est = CostEstimate {
                device: target.to_string(),
                compute_us,
                transfer_us,
                total_us: compute_us + transfer_us,
            };
            (d, est)
        })
        .collect();
    // Stable sort: ties keep priority order.
    estimates.sort_by(|a, b| a.1.total_us.total_cmp(&b.1.total_us));
    let best = estimates[0].0;
    (
        best,
        Rule::Cost {
            estimates: estimates.into_iter().map(|(_, e)| e).collect(),
        },
    )
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Priority => "priority",
            Policy::Cost => "cost",
        })
    }
}
