//! The models document (`GET /api/models`, `tessera models --json`):
//! every named model with its state, inputs and outputs, copies (state,
//! workers, load) and plan drawn as subgraphs (device, worker, nodes
//! counted, tensors between them with their bytes per request, memory,
//! predicted and measured time). A subgraph's nodes, their op types and
//! why each runs where it does are a document of their own
//! (`GET /api/models/{name}/subgraphs/{id}`), so that a model of
//! thousands of nodes is drawn from a small one.

use serde::Serialize;
use tessera_common::affinity::Rule;
use tessera_common::dump::{MeasuredRuns, PlanReport, SubgraphReport};
use tessera_common::memory::MemoryNeed;
use tessera_common::wire::control::ModelStatus;
use tessera_common::wire::routes::{CopyState, RoutingTable, TensorSig};

use crate::http::tensors;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelsDoc {
    pub models: Vec<ModelDoc>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelDoc {
    pub name: String,
    /// `READY`, `LOADING`, `UNAVAILABLE`, `UNLOADED`.
    pub state: &'static str,
    /// Why it is not ready, where known.
    pub reason: String,
    /// The network serving it (0: none).
    pub network: u64,
    /// It generates text (the OpenAI endpoints serve it).
    pub generative: bool,
    pub inputs: Vec<TensorDoc>,
    pub outputs: Vec<TensorDoc>,
    pub copies: Vec<CopyDoc>,
    /// How it is cut (absent while it is not deployed).
    pub plan: Option<PlanDoc>,
}

/// A graph input or output, as KServe v2 describes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorDoc {
    pub name: String,
    pub datatype: &'static str,
    /// -1 for a dimension the model leaves open.
    pub shape: Vec<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CopyDoc {
    /// 1-based.
    pub index: u32,
    /// `ready`, `healing`, `broken`.
    pub state: &'static str,
    pub reason: String,
    pub deployment: Option<u64>,
    pub hosts: Vec<String>,
    pub predicted_latency_us: f64,
    /// From its workers' heartbeats.
    pub requests_per_s: f64,
    pub queued: u32,
    pub sequences: u32,
    pub waiting: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanDoc {
    /// Predicted requests per second of all copies together.
    pub predicted_rps: f64,
    /// The first copy's subgraphs, in pipeline order.
    pub subgraphs: Vec<SubgraphDoc>,
    /// Every copy: the same subgraphs on its own devices.
    pub copies: Vec<PlacedCopy>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubgraphDoc {
    pub id: usize,
    /// `host/DEVICE`.
    pub device: String,
    pub host: Option<String>,
    pub nodes: usize,
    /// The op types of its nodes, most frequent first, with their counts.
    pub op_counts: Vec<(String, usize)>,
    /// Nodes that fell back here: a device before this one in the
    /// priority order cannot run them, or none can (placed on the
    /// fallback device).
    pub fell_back: usize,
    pub inputs: Vec<EdgeDoc>,
    pub outputs: Vec<String>,
    /// Subgraphs whose outputs it reads.
    pub depends_on: Vec<usize>,
    pub memory: MemoryNeed,
    pub predicted_compute_us: f64,
    pub predicted_transfer_us: f64,
}

/// A tensor a subgraph reads, and its bytes per request (from its shape;
/// an open dimension counted as the cost model's default).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EdgeDoc {
    pub name: String,
    pub bytes: u64,
}

/// One copy's placement and its subgraphs' measured runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlacedCopy {
    pub deployment: u64,
    pub hosts: Vec<String>,
    /// Each subgraph's `host/DEVICE`, in subgraph order.
    pub devices: Vec<String>,
    /// Each subgraph's runs so far and mean compute time of one, µs.
    pub runs: Vec<u64>,
    pub us_per_run: Vec<f64>,
}

/// One subgraph's nodes (`/api/models/{name}/subgraphs/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SubgraphNodesDoc {
    pub model: String,
    pub id: usize,
    pub device: String,
    pub nodes: Vec<NodeDoc>,
    pub inputs: Vec<EdgeDoc>,
    pub outputs: Vec<String>,
    /// Its runs on each copy.
    pub runs: Vec<u64>,
    pub us_per_run: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeDoc {
    pub name: String,
    pub op_type: String,
    /// The devices whose QueryNetwork answer holds it, in priority order.
    pub supported_on: Vec<String>,
    /// The rule that chose its device.
    pub decision: Option<Rule>,
}

impl ModelDoc {
    /// The document of `status`, with its routing table and plan where
    /// it has them.
    pub fn of(
        status: &ModelStatus,
        table: Option<&RoutingTable>,
        plan: Option<&PlanReport>,
    ) -> ModelDoc {
        let tensors = |list: Option<&Vec<TensorSig>>| {
            list.map(|l| tensors::metadata(l))
                .unwrap_or_default()
                .into_iter()
                .map(|(name, datatype, shape)| TensorDoc {
                    name,
                    datatype,
                    shape,
                })
                .collect()
        };
        ModelDoc {
            name: status.name.clone(),
            state: status.state.as_str(),
            reason: status.reason.clone(),
            network: status.network,
            generative: table.is_some_and(|t| t.generation.is_some()),
            inputs: tensors(table.map(|t| &t.signature.inputs)),
            outputs: tensors(table.map(|t| &t.signature.outputs)),
            copies: table.map(copies).unwrap_or_default(),
            plan: plan.map(PlanDoc::of),
        }
    }
}

fn copies(table: &RoutingTable) -> Vec<CopyDoc> {
    table
        .copies
        .iter()
        .map(|c| {
            let (state, reason) = match &c.state {
                CopyState::Ready => ("ready", String::new()),
                CopyState::Healing => ("healing", String::new()),
                CopyState::Broken(why) => ("broken", why.clone()),
            };
            let route = c.deployment.as_ref();
            CopyDoc {
                index: c.index,
                state,
                reason,
                deployment: route.map(|d| d.id),
                hosts: route.map_or_else(Vec::new, |d| {
                    d.hosts.iter().map(|h| h.name.clone()).collect()
                }),
                predicted_latency_us: route.map_or(0.0, |d| d.predicted_latency_us),
                requests_per_s: c.load.rate,
                queued: c.load.queued,
                sequences: c.load.sequences,
                waiting: c.load.waiting,
            }
        })
        .collect()
}

impl PlanDoc {
    pub fn of(plan: &PlanReport) -> PlanDoc {
        PlanDoc {
            predicted_rps: plan.predicted_rps,
            subgraphs: plan.subgraphs.iter().map(|sg| subgraph(plan, sg)).collect(),
            copies: placed_copies(plan),
        }
    }
}

/// Every copy of `plan` with its subgraphs' devices and runs (the plan's
/// own subgraphs when it lists no replicas).
fn placed_copies(plan: &PlanReport) -> Vec<PlacedCopy> {
    if plan.replicas.is_empty() {
        return vec![PlacedCopy {
            deployment: 0,
            hosts: plan.hosts.clone(),
            devices: plan.subgraphs.iter().map(|s| s.device.clone()).collect(),
            runs: plan.subgraphs.iter().map(|s| runs(s.measured)).collect(),
            us_per_run: plan.subgraphs.iter().map(|s| per_run(s.measured)).collect(),
        }];
    }
    plan.replicas
        .iter()
        .map(|r| PlacedCopy {
            deployment: r.deployment,
            hosts: r.hosts.clone(),
            devices: r.devices.clone(),
            runs: r.measured.iter().map(|m| runs(*m)).collect(),
            us_per_run: r.measured.iter().map(|m| per_run(*m)).collect(),
        })
        .collect()
}

fn runs(m: Option<MeasuredRuns>) -> u64 {
    m.map_or(0, |m| m.runs)
}

fn per_run(m: Option<MeasuredRuns>) -> f64 {
    m.map_or(0.0, |m| (m.us_per_run() * 10.0).round() / 10.0)
}

fn edges(sg: &SubgraphReport) -> Vec<EdgeDoc> {
    sg.inputs
        .iter()
        .enumerate()
        .map(|(i, name)| EdgeDoc {
            name: name.clone(),
            bytes: sg.input_bytes.get(i).copied().unwrap_or(0),
        })
        .collect()
}

fn subgraph(plan: &PlanReport, sg: &SubgraphReport) -> SubgraphDoc {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for op in &sg.op_types {
        match counts.iter_mut().find(|(o, _)| o == op) {
            Some((_, n)) => *n += 1,
            None => counts.push((op.clone(), 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let fell_back = sg
        .nodes
        .iter()
        .filter(|n| {
            plan.explanations.get(*n).is_some_and(|e| {
                matches!(e.decision, Rule::Fallback | Rule::Priority { rank: 1.. })
            })
        })
        .count();
    SubgraphDoc {
        id: sg.id,
        device: sg.device.clone(),
        host: sg.host.clone(),
        nodes: sg.nodes.len(),
        op_counts: counts,
        fell_back,
        inputs: edges(sg),
        outputs: sg.outputs.clone(),
        depends_on: sg.depends_on.clone(),
        memory: sg.memory,
        predicted_compute_us: sg.predicted_compute_us,
        predicted_transfer_us: sg.predicted_transfer_us,
    }
}

impl SubgraphNodesDoc {
    /// Subgraph `id` of `plan` (none: no such subgraph).
    pub fn of(model: &str, plan: &PlanReport, id: usize) -> Option<SubgraphNodesDoc> {
        let sg = plan.subgraphs.iter().find(|s| s.id == id)?;
        let index = plan.subgraphs.iter().position(|s| s.id == id)?;
        let placed = placed_copies(plan);
        Some(SubgraphNodesDoc {
            model: model.to_string(),
            id,
            device: sg.device.clone(),
            nodes: sg
                .nodes
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let why = plan.explanations.get(name);
                    NodeDoc {
                        name: name.clone(),
                        op_type: sg.op_types.get(i).cloned().unwrap_or_default(),
                        supported_on: why.map_or_else(Vec::new, |e| e.supported_on.clone()),
                        decision: why.map(|e| e.decision.clone()),
                    }
                })
                .collect(),
            inputs: edges(sg),
            outputs: sg.outputs.clone(),
            runs: placed
                .iter()
                .map(|c| c.runs.get(index).copied().unwrap_or(0))
                .collect(),
            us_per_run: placed
                .iter()
                .map(|c| c.us_per_run.get(index).copied().unwrap_or(0.0))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tessera_common::dump::{NodeExplanation, ReplicaReport};
    use tessera_common::wire::control::ModelState;

    fn plan() -> PlanReport {
        let sg = |id: usize, device: &str, nodes: &[&str], ops: &[&str]| SubgraphReport {
            id,
            device: device.into(),
            host: device.split('/').next().map(str::to_string),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            op_types: ops.iter().map(|s| s.to_string()).collect(),
            inputs: vec![format!("t{id}")],
            input_bytes: vec![4096],
            depends_on: if id == 0 { vec![] } else { vec![id - 1] },
            measured: Some(MeasuredRuns {
                runs: 4,
                busy_us: 1_000,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut explanations = BTreeMap::new();
        explanations.insert(
            "c".to_string(),
            NodeExplanation {
                supported_on: vec!["node-a/CPU".into()],
                decision: Rule::Fallback,
            },
        );
        explanations.insert(
            "d".to_string(),
            NodeExplanation {
                supported_on: vec!["node-b/CPU".into()],
                decision: Rule::Priority { rank: 1 },
            },
        );
        explanations.insert(
            "e".to_string(),
            NodeExplanation {
                supported_on: vec!["node-a/CPU".into(), "node-b/CPU".into()],
                decision: Rule::Manual,
            },
        );
        PlanReport {
            subgraphs: vec![
                sg(0, "node-a/CPU", &["a", "b"], &["Conv", "Relu"]),
                sg(1, "node-b/CPU", &["c", "d", "e"], &["Conv", "Add", "Conv"]),
            ],
            explanations,
            replicas: vec![
                ReplicaReport {
                    deployment: 5,
                    hosts: vec!["node-a".into(), "node-b".into()],
                    devices: vec!["node-a/CPU".into(), "node-b/CPU".into()],
                    measured: vec![
                        None,
                        Some(MeasuredRuns {
                            runs: 2,
                            busy_us: 50,
                            ..Default::default()
                        }),
                    ],
                    ..Default::default()
                },
                ReplicaReport {
                    deployment: 6,
                    hosts: vec!["node-c".into()],
                    devices: vec!["node-c/CPU".into(), "node-c/CPU".into()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_plan_is_drawn_as_subgraphs_with_op_counts_and_copies() {
        let doc = PlanDoc::of(&plan());
        assert_eq!(
            doc.subgraphs[1].op_counts,
            [("Conv".to_string(), 2), ("Add".to_string(), 1)]
        );
        assert_eq!(doc.subgraphs[1].fell_back, 2);
        assert_eq!(doc.subgraphs[1].inputs[0].bytes, 4096);
        assert_eq!(doc.copies.len(), 2);
        assert_eq!(doc.copies[0].us_per_run, [0.0, 25.0]);
        assert_eq!(doc.copies[1].devices[0], "node-c/CPU");
    }

    #[test]
    fn a_subgraphs_nodes_say_their_op_types_and_why() {
        let doc = SubgraphNodesDoc::of("rec", &plan(), 1).unwrap();
        let c = &doc.nodes[0];
        assert_eq!((c.name.as_str(), c.op_type.as_str()), ("c", "Conv"));
        assert_eq!(c.decision, Some(Rule::Fallback));
        assert_eq!(doc.runs, [2, 0]);
        assert!(SubgraphNodesDoc::of("rec", &plan(), 9).is_none());
    }

    #[test]
    fn a_model_without_a_table_or_plan_has_its_state_only() {
        let status = ModelStatus {
            name: "rec".into(),
            state: ModelState::Unavailable,
            network: 0,
            reason: "no worker".into(),
        };
        let doc = ModelDoc::of(&status, None, None);
        assert_eq!((doc.state, doc.plan.is_none()), ("UNAVAILABLE", true));
        assert!(doc.inputs.is_empty() && doc.copies.is_empty());
    }
}
