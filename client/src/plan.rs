//! The plan a load returns: the coordinator's JSON dump of the partition
//! (subgraphs, affinity and why each node went where), with typed access to
//! the subgraphs.

use serde_json::Value;

/// One subgraph of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSubgraph {
    pub id: u64,
    /// `host/DEVICE`.
    pub device: String,
    pub nodes: usize,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// The cost model's estimates: compute on its device, and moving its
    /// inputs from their producers' devices (µs).
    pub predicted_compute_us: f64,
    pub predicted_transfer_us: f64,
}

/// A loaded network's plan.
#[derive(Debug, Clone)]
pub struct Plan {
    pub subgraphs: Vec<PlanSubgraph>,
    /// Workers it runs on.
    pub hosts: Vec<String>,
    /// What simplification folded and removed before planning.
    pub simplified: tessera_common::simplify::SimplifyReport,
    /// The whole dump (`affinity`, `explanations`, ...).
    pub json: Value,
}

impl Plan {
    /// Why `node` went where it did (its rule and the devices that support
    /// it), as the coordinator explained it.
    pub fn explanation(&self, node: &str) -> Option<&Value> {
        self.json["explanations"].get(node)
    }
}

impl Plan {
    pub(crate) fn parse(text: &str) -> Result<Plan, String> {
        let json: Value = serde_json::from_str(text).map_err(|e| format!("plan: {e}"))?;
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        let subgraphs = json["subgraphs"]
            .as_array()
            .ok_or("plan: no subgraphs")?
            .iter()
            .map(|sg| PlanSubgraph {
                id: sg["id"].as_u64().unwrap_or_default(),
                device: sg["device"].as_str().unwrap_or_default().to_string(),
                nodes: sg["nodes"].as_array().map_or(0, Vec::len),
                inputs: strings(&sg["inputs"]),
                outputs: strings(&sg["outputs"]),
                predicted_compute_us: sg["predicted_compute_us"].as_f64().unwrap_or(0.0),
                predicted_transfer_us: sg["predicted_transfer_us"].as_f64().unwrap_or(0.0),
            })
            .collect();
        Ok(Plan {
            subgraphs,
            hosts: strings(&json["hosts"]),
            simplified: serde_json::from_value(json["simplified"].clone()).unwrap_or_default(),
            json,
        })
    }
}
