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
}

/// A loaded network's plan.
#[derive(Debug, Clone)]
pub struct Plan {
    pub subgraphs: Vec<PlanSubgraph>,
    /// Workers it runs on.
    pub hosts: Vec<String>,
    /// The whole dump (`affinity`, `explanations`, ...).
    pub json: Value,
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
            })
            .collect();
        Ok(Plan {
            subgraphs,
            hosts: strings(&json["hosts"]),
            json,
        })
    }
}
