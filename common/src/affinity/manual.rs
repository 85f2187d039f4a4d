//! Manual affinity files: `{"node": "DEVICE", ...}`, read against the
//! graph. A name taken from the model file (e.g. in Netron) may name a node
//! that has nothing to place: a `Constant` (it goes with the subgraphs that
//! read it) or a node that simplification folded into a constant or
//! removed as dead. Such names are accepted and reported; a name that is
//! in the model nowhere stays an error.

use std::collections::BTreeMap;
use std::fmt;

use super::{unknown_device, AffinityError, DeviceId, DevicePriority};
use crate::graph::{Graph, NodeId};
use crate::simplify::SimplifyReport;

/// Why a named node has nothing to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnplacedWhy {
    /// A `Constant` node: it goes with the subgraphs that read it.
    Constant,
    /// Folded into a constant by simplification (its op type).
    Folded(String),
    /// Removed by simplification: no graph output depends on it.
    Dead(String),
}

impl fmt::Display for UnplacedWhy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnplacedWhy::Constant => {
                write!(f, "a Constant, which goes with the subgraphs that read it")
            }
            UnplacedWhy::Folded(op) => write!(f, "a {op} folded into a constant by simplification"),
            UnplacedWhy::Dead(op) => {
                write!(
                    f,
                    "a {op} removed by simplification (no output depends on it)"
                )
            }
        }
    }
}

/// A named node of a manual affinity with nothing to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unplaced {
    pub name: String,
    pub device: DeviceId,
    pub why: UnplacedWhy,
}

impl fmt::Display for Unplaced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "manual affinity '{}' → {}: nothing to place, it is {}",
            self.name, self.device, self.why
        )
    }
}

/// A manual affinity file, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManualAffinity {
    /// Op nodes and the device each must run on.
    pub nodes: BTreeMap<NodeId, DeviceId>,
    /// Named nodes with nothing to place, in the file's order of names.
    pub unplaced: Vec<Unplaced>,
}

/// Why `name` has nothing to place in `graph` (simplified as `simplified`
/// says), or `None` where it is in the model nowhere.
pub(crate) fn unplaced_why(
    graph: &Graph,
    simplified: &SimplifyReport,
    name: &str,
) -> Option<UnplacedWhy> {
    if graph.onnx_node_by_name(name).is_some() {
        return Some(UnplacedWhy::Constant);
    }
    if let Some(n) = simplified.folded.iter().find(|n| n.node == name) {
        // Constant nodes become initializers: they were never ops.
        return Some(match n.op_type.as_str() {
            "Constant" => UnplacedWhy::Constant,
            op => UnplacedWhy::Folded(op.to_string()),
        });
    }
    if simplified.dropped_constants.iter().any(|n| n == name) {
        return Some(UnplacedWhy::Constant);
    }
    let dead = simplified.dead.iter().find(|n| n.node == name)?;
    Some(UnplacedWhy::Dead(dead.op_type.clone()))
}

/// Parses a manual affinity file: a JSON object `{"node": "DEVICE", ...}`, or
/// an object with such a map under `"affinity"` (so a `_subgraphs.json` dump
/// can be fed back). Devices are checked against the priority list; nodes
/// against `graph`, and names of nodes that `simplified` folded or removed
/// are accepted as [`Unplaced`].
pub fn parse_manual_affinity(
    text: &str,
    graph: &Graph,
    simplified: &SimplifyReport,
    priority: &DevicePriority,
) -> Result<ManualAffinity, AffinityError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| AffinityError::BadFile(e.to_string()))?;
    let map = value
        .get("affinity")
        .unwrap_or(&value)
        .as_object()
        .ok_or_else(|| {
            AffinityError::BadFile("expected a JSON object of node name → device".into())
        })?;
    let mut out = ManualAffinity::default();
    for (name, device) in map {
        let device = device.as_str().ok_or_else(|| {
            AffinityError::BadFile(format!("device of '{name}' must be a string"))
        })?;
        let id = DeviceId::parse(device).map_err(|e| AffinityError::BadFile(e.to_string()))?;
        if priority.position(&id).is_none() {
            return Err(unknown_device(
                &id,
                &format!("manual affinity of node '{name}'"),
                priority,
            ));
        }
        if let Some(node) = graph.op_by_name(name) {
            out.nodes.insert(node, id);
            continue;
        }
        let why =
            unplaced_why(graph, simplified, name).ok_or_else(|| AffinityError::UnknownNode {
                name: name.clone(),
                context: "manual affinity".into(),
            })?;
        out.unplaced.push(Unplaced {
            name: name.clone(),
            device: id,
            why,
        });
    }
    Ok(out)
}
