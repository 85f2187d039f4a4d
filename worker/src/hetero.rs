//! HETERO in one process: query every plugin, assign affinities, partition,
//! export, compile each subgraph on its plugin, then run requests through
//! the subgraph DAG (subgraphs whose inputs are ready run concurrently).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_common::affinity::{AnalyticCostModel, DeviceId, DevicePriority, Policy, SupportSet};
use tessera_common::graph::Graph;
use tessera_common::onnx::encode_model;
use tessera_common::onnx::proto::ModelProto;
use tessera_common::partition::{Algorithm, Partition};
use tessera_common::plan::{check_inputs, complete_types, plan, prepare, PlanError, PlanOptions};
use tessera_common::simplify::SimplifyReport;
use tessera_common::tensor::Tensor;

use crate::plugin::{CompiledSubgraph, Config, DevicePlugin, PerfCounter, PluginError};

/// Errors of loading or running a network.
#[derive(Debug, thiserror::Error)]
pub enum HeteroError {
    #[error("no plugin for device {0} (registered: {1})")]
    UnknownDevice(String, String),
    #[error("model: {0}")]
    Model(String),
    #[error("planning: {0}")]
    Plan(String),
    #[error("subgraph {sg} on {device}: {source}")]
    Plugin {
        sg: usize,
        device: String,
        #[source]
        source: PluginError,
    },
    #[error("{device} QueryNetwork: {source}")]
    Query {
        device: String,
        #[source]
        source: PluginError,
    },
    #[error("bad inputs: {0}")]
    BadInput(String),
}

/// How to plan a network.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub priority: DevicePriority,
    pub policy: Policy,
    pub algorithm: Algorithm,
    pub strict: bool,
    /// Manual affinity: node name → device.
    pub manual: BTreeMap<String, DeviceId>,
    /// Per-compile configuration for every subgraph.
    pub config: Config,
    /// Concrete shapes of graph inputs: the model is simplified for them
    /// (see `tessera_common::simplify`); empty: dynamic dims stay.
    pub shapes: BTreeMap<String, Vec<usize>>,
}

impl LoadOptions {
    /// Each node on the first device of `priority` that supports it: the
    /// priority policy, the fast partitioner, strict, no manual affinity,
    /// the plugins' default configuration.
    pub fn by_priority(priority: DevicePriority) -> LoadOptions {
        LoadOptions {
            priority,
            policy: Policy::Priority,
            algorithm: Algorithm::Fast,
            strict: true,
            manual: BTreeMap::new(),
            config: Config::default(),
            shapes: BTreeMap::new(),
        }
    }
}

struct Stage {
    device: String,
    compiled: Arc<dyn CompiledSubgraph>,
    inputs: Vec<String>,
    outputs: Vec<String>,
    deps: Vec<usize>,
}

/// A network loaded on its plugins.
pub struct Network {
    graph: Graph,
    partition: Partition,
    stages: Vec<Stage>,
    simplified: SimplifyReport,
}

/// One request's outputs, with counters per subgraph.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Graph outputs in model order.
    pub outputs: Vec<(String, Tensor)>,
    /// Per subgraph: device, wall time and per-node counters.
    pub subgraphs: Vec<(String, Duration, Vec<PerfCounter>)>,
    pub total: Duration,
}

impl Network {
    /// Plans and compiles `model` on `plugins` (device name → plugin).
    pub fn load(
        model: ModelProto,
        plugins: &[(DeviceId, Arc<dyn DevicePlugin>)],
        options: &LoadOptions,
    ) -> Result<Network, HeteroError> {
        let (graph, simplified) =
            prepare(&model, &options.shapes).map_err(|e| HeteroError::Model(e.to_string()))?;
        if !simplified.is_empty() {
            tracing::info!("simplified: {}", simplified.summary());
        }
        let registered = || {
            plugins
                .iter()
                .map(|(d, _)| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let plugin_of = |d: &DeviceId| {
            plugins
                .iter()
                .find(|(id, _)| id == d)
                .map(|(_, p)| p.clone())
                .ok_or_else(|| HeteroError::UnknownDevice(d.to_string(), registered()))
        };
        let mut supports = HashMap::new();
        let mut types = BTreeMap::new();
        for d in &options.priority.devices {
            let answer = plugin_of(d)?
                .query_network(graph.model())
                .map_err(|source| HeteroError::Query {
                    device: d.to_string(),
                    source,
                })?;
            tracing::debug!(device = %d, supported = answer.supported.len(), "QueryNetwork");
            types.extend(
                answer
                    .types
                    .values()
                    .map(|s| (s.name.clone(), s.reported_type())),
            );
            supports.insert(d.clone(), SupportSet::from_nodes(answer.supported));
        }
        let graph = complete_types(graph, &types).map_err(|e| HeteroError::Model(e.to_string()))?;
        let planned = plan(
            &graph,
            &supports,
            &AnalyticCostModel::default(),
            &PlanOptions {
                priority: options.priority.clone(),
                policy: options.policy,
                algorithm: options.algorithm,
                strict: options.strict,
                manual: options.manual.clone(),
                simplified,
                ..Default::default()
            },
        )
        .map_err(|e| HeteroError::Plan(e.to_string()))?;
        let mut stages = Vec::with_capacity(planned.stages.len());
        for (i, stage) in planned.stages.iter().enumerate() {
            let started = Instant::now();
            let model = planned
                .export_stage(&graph, i)
                .map_err(|e| HeteroError::Plan(e.to_string()))?;
            let compiled = plugin_of(&stage.device)?
                .compile(&bytes::Bytes::from(encode_model(&model)), &options.config)
                .map_err(|source| HeteroError::Plugin {
                    sg: i,
                    device: stage.device.to_string(),
                    source,
                })?;
            tracing::info!(subgraph = i, device = %stage.device, nodes = stage.nodes, "compiled in {:?}", started.elapsed());
            stages.push(Stage {
                device: stage.device.to_string(),
                compiled,
                inputs: stage.inputs.clone(),
                outputs: stage.outputs.clone(),
                deps: stage.deps.clone(),
            });
        }
        let p = planned.partition;
        Ok(Network {
            graph,
            partition: p,
            stages,
            simplified: planned.simplified,
        })
    }

    /// What simplification folded and removed before planning.
    pub fn simplified(&self) -> &SimplifyReport {
        &self.simplified
    }

    pub fn partition(&self) -> &Partition {
        &self.partition
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Runs one request. `inputs` holds every graph input by name.
    pub fn run(&self, inputs: &HashMap<String, Tensor>) -> Result<RunResult, HeteroError> {
        let started = Instant::now();
        self.check_inputs(inputs)?;
        // Tensors produced so far; graph inputs are read from `inputs`.
        let mut values: HashMap<String, Tensor> = HashMap::new();
        let mut done = vec![false; self.stages.len()];
        let mut timings: Vec<Option<(Duration, Vec<PerfCounter>)>> = vec![None; self.stages.len()];
        while done.iter().any(|d| !d) {
            let ready: Vec<usize> = (0..self.stages.len())
                .filter(|&i| !done[i] && self.stages[i].deps.iter().all(|&d| done[d]))
                .collect();
            if ready.is_empty() {
                return Err(HeteroError::Plan(
                    "subgraph dependencies do not resolve".into(),
                ));
            }
            let run_stage = |i: usize, feeds: Vec<Tensor>| {
                let stage = &self.stages[i];
                let t = Instant::now();
                let r = stage
                    .compiled
                    .infer(&feeds)
                    .map_err(|source| HeteroError::Plugin {
                        sg: i,
                        device: stage.device.clone(),
                        source,
                    });
                (i, r.map(|r| (r, t.elapsed())))
            };
            let feeds_of = |i: usize| -> Vec<Tensor> {
                self.stages[i]
                    .inputs
                    .iter()
                    .filter_map(|n| values.get(n).or_else(|| inputs.get(n)).cloned())
                    .collect()
            };
            // One ready subgraph runs on this thread; several run concurrently.
            let results: Vec<(usize, Result<_, HeteroError>)> = if ready.len() == 1 {
                vec![run_stage(ready[0], feeds_of(ready[0]))]
            } else {
                std::thread::scope(|s| {
                    let handles: Vec<_> = ready
                        .iter()
                        .map(|&i| {
                            let feeds = feeds_of(i);
                            s.spawn(move || run_stage(i, feeds))
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|_| {
                                (
                                    usize::MAX,
                                    Err(HeteroError::Plan("a subgraph thread panicked".into())),
                                )
                            })
                        })
                        .collect()
                })
            };
            for (i, r) in results {
                let (result, elapsed) = r?;
                for (name, t) in self.stages[i].outputs.iter().zip(result.outputs) {
                    values.insert(name.clone(), t);
                }
                timings[i] = Some((elapsed, result.counters));
                done[i] = true;
            }
        }
        let outputs = self
            .graph
            .outputs
            .iter()
            .map(|&t| {
                let name = self.graph.tensor(t).name.clone();
                values
                    .get(&name)
                    .or_else(|| inputs.get(&name))
                    .map(|v| (name.clone(), v.clone()))
                    .ok_or_else(|| HeteroError::Plan(format!("output '{name}' was not produced")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let subgraphs = self
            .stages
            .iter()
            .zip(timings)
            .map(|(s, t)| {
                let (d, c) = t.unwrap_or_default();
                (s.device.clone(), d, c)
            })
            .collect();
        Ok(RunResult {
            outputs,
            subgraphs,
            total: started.elapsed(),
        })
    }

    fn check_inputs(&self, inputs: &HashMap<String, Tensor>) -> Result<(), HeteroError> {
        check_inputs(&self.graph, inputs).map_err(|e| match e {
            PlanError::BadInput(m) => HeteroError::BadInput(m),
            e => HeteroError::Plan(e.to_string()),
        })
    }
}
