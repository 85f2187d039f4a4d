//! Planning a network, from the devices' QueryNetwork answers to exported
//! subgraphs: affinity assignment, subgraph selection, the fit into the
//! devices' memory (`fit`: pipelined stages when the policy's placement
//! does not fit) and export, plus the check of a request's inputs against
//! the graph. HETERO in one process and the distributed coordinator both
//! plan through here.

mod fit;

pub use fit::{DeviceMemory, Pipelined, PlanMemory};

use std::collections::{BTreeMap, HashMap};

use crate::affinity::{
    assign, AffinityRequest, Assignment, CostModel, DeviceId, DevicePriority, Policy, SupportSet,
};
use crate::graph::{Graph, NodeId, TensorId};
use crate::memory::pipeline::FitError;
use crate::onnx::proto::ModelProto;
use crate::partition::{partition, Algorithm, Partition, PartitionOptions};
use crate::simplify::{simplify, SimplifyOptions, SimplifyReport};
use crate::tensor::Tensor;

/// Why a network could not be planned, or a request's inputs do not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("no node named '{0}' (manual affinity)")]
    UnknownNode(String),
    #[error("affinity: {0}")]
    Affinity(String),
    #[error("partition: {0}")]
    Partition(String),
    #[error("export: {0}")]
    Export(String),
    #[error("bad inputs: {0}")]
    BadInput(String),
    #[error("{0}")]
    Simplify(#[from] crate::simplify::SimplifyError),
    #[error("{0}")]
    Memory(Box<FitError>),
    #[error("{0}; drop the manual affinity to let the planner cut the model by memory")]
    ManualDoesNotFit(String),
    #[error("{0}")]
    PipelineShort(String),
    #[error(
        "the model's {role} '{name}' is a sequence or an optional; requests carry tensors \
         only (a plugin's infer_values runs such a graph whole)"
    )]
    CollectionAtGraphBoundary { role: &'static str, name: String },
}

/// How to plan.
#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    pub priority: DevicePriority,
    pub policy: Policy,
    pub algorithm: Algorithm,
    pub strict: bool,
    /// Manual affinity: node name → device. Entries naming nodes that
    /// simplification folded away are dropped.
    pub manual: BTreeMap<String, DeviceId>,
    /// What [`prepare`] did to the model (shown with the plan).
    pub simplified: SimplifyReport,
    /// Bytes each device may use (free memory); a device not listed is not
    /// limited. When the policy's placement does not fit, the model is cut
    /// into pipelined stages that do.
    pub memory: HashMap<DeviceId, u64>,
    /// The largest batch a request may carry (activations are counted at
    /// it); 0 or 1 without dynamic batching.
    pub max_batch: u64,
    /// Per-sequence state nodes keep between requests: node name → bytes.
    pub state: BTreeMap<String, u64>,
    /// The placement this network had (node name → device), when it is
    /// planned again: a pipelined placement that still fits and predicts
    /// within 10% of a new one is kept (its stages' workers have them
    /// compiled, and their weights need not travel again).
    pub previous: BTreeMap<String, DeviceId>,
}

/// One subgraph to compile ([`Plan::export_stage`] makes its model).
#[derive(Debug, Clone)]
pub struct Stage {
    pub device: DeviceId,
    /// Input and output tensor names, in the exported model's order.
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// Stages whose outputs this one reads.
    pub deps: Vec<usize>,
    pub nodes: usize,
}

/// A planned network.
#[derive(Debug, Clone)]
pub struct Plan {
    pub assignment: Assignment,
    pub partition: Partition,
    pub stages: Vec<Stage>,
    /// What simplification did before planning.
    pub simplified: SimplifyReport,
    /// Each device's memory need, and the pipelining if there was any.
    pub memory: PlanMemory,
}

impl Plan {
    /// Stage `i` as a standalone model (its weights shared with `graph`'s,
    /// not copied): made when it is deployed, not when it is planned.
    pub fn export_stage(&self, graph: &Graph, i: usize) -> Result<ModelProto, PlanError> {
        let sg = self
            .partition
            .subgraphs
            .get(i)
            .ok_or_else(|| PlanError::Export(format!("no stage {i}")))?;
        crate::export::export_subgraph(graph, &self.partition, sg)
            .map_err(|e| PlanError::Export(e.to_string()))
    }
}

/// The model as it is planned: simplified (concrete input `shapes` where
/// given, constants and shape computations folded, dead nodes removed; see
/// [`crate::simplify`]) and built into a graph. QueryNetwork is asked
/// about `graph.model()`.
pub fn prepare(
    model: &ModelProto,
    shapes: &BTreeMap<String, Vec<usize>>,
) -> Result<(Graph, SimplifyReport), PlanError> {
    let (simplified, report) = simplify(
        model,
        &SimplifyOptions {
            input_shapes: shapes.clone(),
            ..Default::default()
        },
    )?;
    let graph = Graph::from_model(simplified)
        .map_err(|e| PlanError::Simplify(crate::simplify::SimplifyError::Graph(e.to_string())))?;
    Ok((graph, report))
}

/// A tensor's element type and shape as a plugin's own analysis found
/// them (`None`: not found; a shape of `None`: the rank is not known).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReportedType {
    pub elem: Option<crate::onnx::ElemType>,
    pub shape: Option<Vec<crate::graph::Dim>>,
}

/// `graph` with the element types and shapes its tensors lack, as plugins'
/// QueryNetwork answers reported them (declared as `value_info`; what the
/// model declares or inference derived is kept). Node names are unchanged.
pub fn complete_types(
    graph: Graph,
    reported: &BTreeMap<String, ReportedType>,
) -> Result<Graph, PlanError> {
    use crate::onnx::proto::{
        tensor_shape_proto::{dimension, Dimension},
        type_proto, TensorShapeProto, TypeProto, ValueInfoProto,
    };
    let mut infos = Vec::new();
    for t in &graph.tensors {
        let Some(r) = reported.get(&t.name) else {
            continue;
        };
        let elem = t.elem_type.or(r.elem);
        let shape = t.shape.clone().or_else(|| r.shape.clone());
        if (elem, &shape) == (t.elem_type, &t.shape) {
            continue;
        }
        let shape = shape.map(|dims| TensorShapeProto {
            dim: dims
                .iter()
                .map(|d| Dimension {
                    denotation: None,
                    value: match d {
                        crate::graph::Dim::Known(v) => Some(dimension::Value::DimValue(*v)),
                        crate::graph::Dim::Sym(s) => Some(dimension::Value::DimParam(s.clone())),
                        crate::graph::Dim::Unknown => None,
                    },
                })
                .collect(),
        });
        infos.push(ValueInfoProto {
            name: Some(t.name.clone()),
            r#type: Some(TypeProto {
                denotation: None,
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: elem.map(|e| e.0),
                    shape,
                })),
            }),
            ..Default::default()
        });
    }
    if infos.is_empty() {
        return Ok(graph);
    }
    let names: std::collections::HashSet<String> =
        infos.iter().filter_map(|v| v.name.clone()).collect();
    let mut model = graph.model().clone();
    if let Some(g) = model.graph.as_mut() {
        // A partial declaration of the same tensor is replaced.
        g.value_info
            .retain(|v| !names.contains(v.name.as_deref().unwrap_or("")));
        g.value_info.extend(infos);
    }
    Graph::from_model(model)
        .map_err(|e| PlanError::Simplify(crate::simplify::SimplifyError::Graph(e.to_string())))
}

/// Plans `graph` over the devices of `options.priority`, each supporting
/// the nodes of its entry in `supports`.
pub fn plan(
    graph: &Graph,
    supports: &HashMap<DeviceId, SupportSet>,
    cost_model: &dyn CostModel,
    options: &PlanOptions,
) -> Result<Plan, PlanError> {
    collections_at_boundary(graph)?;
    let mut manual = BTreeMap::new();
    for (name, device) in &options.manual {
        if let Some(node) = graph.op_by_name(name) {
            manual.insert(node, device.clone());
            continue;
        }
        // A Constant, or a node simplification folded or removed: nothing
        // to place (`parse_manual_affinity` reports these to the user).
        if crate::affinity::unplaced_why(graph, &options.simplified, name).is_none() {
            return Err(PlanError::UnknownNode(name.clone()));
        }
    }
    let placed = place(graph, supports, cost_model, options, &manual)?;
    let fitted = fit::fit(graph, supports, cost_model, options, &manual, placed)?;
    let (assignment, partition) = (fitted.assignment, fitted.partition);
    crate::export::check_boundaries(graph, &partition)
        .map_err(|e| PlanError::Export(e.to_string()))?;
    let names = |ts: &[TensorId]| -> Vec<String> {
        ts.iter().map(|&t| graph.tensor(t).name.clone()).collect()
    };
    let stages = partition
        .subgraphs
        .iter()
        .map(|sg| Stage {
            device: partition.device_of(sg).clone(),
            inputs: names(&sg.inputs),
            outputs: names(&sg.outputs),
            deps: partition.dependencies(graph, sg),
            nodes: sg.nodes.len(),
        })
        .collect();
    Ok(Plan {
        assignment,
        partition,
        stages,
        simplified: options.simplified.clone(),
        memory: fitted.memory,
    })
}

/// Affinity (the policy, `manual` winning) and the subgraphs it makes.
fn place(
    graph: &Graph,
    supports: &HashMap<DeviceId, SupportSet>,
    cost_model: &dyn CostModel,
    options: &PlanOptions,
    manual: &BTreeMap<NodeId, DeviceId>,
) -> Result<(Assignment, Partition), PlanError> {
    let assignment = assign(
        graph,
        &AffinityRequest {
            priority: &options.priority,
            supports,
            manual,
            policy: options.policy,
            strict: options.strict,
            cost_model,
        },
    )
    .map_err(|e| PlanError::Affinity(e.to_string()))?;
    let partition = partition(
        graph,
        &assignment,
        PartitionOptions {
            algorithm: options.algorithm,
            ..Default::default()
        },
    )
    .map_err(|e| PlanError::Partition(e.to_string()))?;
    Ok((assignment, partition))
}

/// Refuses a graph that takes or returns a sequence or an optional:
/// requests (the wire, the SDK, HTTP) carry tensors.
fn collections_at_boundary(graph: &Graph) -> Result<(), PlanError> {
    let collections = graph.collections();
    let found = |ts: &[TensorId]| ts.iter().find(|t| collections.contains(t)).copied();
    let at = found(&graph.inputs)
        .map(|t| ("input", t))
        .or_else(|| found(&graph.outputs).map(|t| ("output", t)));
    match at {
        Some((role, t)) => Err(PlanError::CollectionAtGraphBoundary {
            role,
            name: graph.tensor(t).name.clone(),
        }),
        None => Ok(()),
    }
}

/// The graph's input and output names, in model order.
pub fn io_names(graph: &Graph) -> (Vec<String>, Vec<String>) {
    let names = |ts: &[TensorId]| ts.iter().map(|&t| graph.tensor(t).name.clone()).collect();
    (names(&graph.inputs), names(&graph.outputs))
}

/// Checks that `inputs` holds every graph input, with its element type and
/// a shape that fits, and nothing else.
pub fn check_inputs(graph: &Graph, inputs: &HashMap<String, Tensor>) -> Result<(), PlanError> {
    crate::wire::routes::Signature::of(graph)
        .check(inputs)
        .map_err(PlanError::BadInput)
}
