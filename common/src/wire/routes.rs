//! Routing tables: what a requester (the SDK, a front door) needs to send a
//! network's requests straight to its workers and take the outputs from
//! them, without the coordinator on the way. The coordinator publishes a
//! table per loaded network, with a version that grows with every change
//! (a copy re-planned, healing, broken; the workers' reported load), and
//! requesters subscribe to it.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::graph::{Dim, Graph};
use crate::onnx::ElemType;
use crate::tensor::Tensor;

/// One network's routes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingTable {
    /// The network's id (as clients know it).
    pub network: u64,
    /// Its name: the named model's, else the one it was loaded with.
    pub name: String,
    /// Grows with every change of this network's table.
    pub version: u64,
    /// Its graph inputs and outputs, in model order.
    pub signature: Signature,
    /// Its copies, each on its own workers.
    pub copies: Vec<CopyRoute>,
    /// A generative network's limits (absent: requests only).
    pub generation: Option<GenerationLimits>,
    /// An embedding network's pooling and input length, its tokenizer
    /// left out (a requester asks for it once: `Embedding`).
    pub embedding: Option<crate::wire::embed::EmbeddingSpec>,
    /// How long the coordinator takes to notice a lost worker, ms: a
    /// requester that cannot reach one waits this long for the table to
    /// say whether it was lost (its copy re-planned).
    pub loss_grace_ms: u64,
}

/// A generative network's limits, as every copy's stages keep them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationLimits {
    /// Its state pairs (what a fresh step sends empty, what stages keep).
    pub state: Vec<crate::graph::StatePair>,
    /// Sequences each copy keeps state for at once.
    pub max_sequences: u32,
    /// Fresh sequences that may wait for room on a copy (a FIFO on its
    /// stages); beyond them a new sequence is refused as busy.
    pub max_queued: u32,
    /// How long a fresh sequence may wait there, ms.
    pub queue_timeout_ms: u64,
    /// Positions a sequence may reach (prompt and generated tokens).
    pub context_length: u32,
}

/// What serves a copy now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CopyState {
    Ready,
    /// Being re-planned after a worker loss (its old deployment, if any,
    /// is listed while it lasts).
    Healing,
    /// No set of workers that remains can run it; why.
    Broken(String),
}

/// One copy of a network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyRoute {
    /// 1-based, as errors name it.
    pub index: u32,
    pub state: CopyState,
    /// The deployment on the workers (absent while none is).
    pub deployment: Option<DeploymentRoute>,
    /// What its workers reported in their last heartbeats.
    pub load: CopyLoad,
    /// Its earlier deployments that still finish what they hold (it moved
    /// off a draining worker): a request in flight on one is not moved.
    pub retiring: Vec<u64>,
}

/// Where one deployment's tensors go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeploymentRoute {
    /// Its id: the network id in every tensor frame of its requests.
    pub id: u64,
    /// Every worker it runs on, with the data address requesters dial.
    pub hosts: Vec<HostRoute>,
    /// Graph input → the workers that read it.
    pub inputs: Vec<(String, Vec<String>)>,
    /// Graph output → the worker that makes it.
    pub outputs: Vec<(String, String)>,
    /// Workers with subgraphs that take no input (sent a trigger with
    /// every request).
    pub triggers: Vec<String>,
    /// Workers with subgraphs that read only state (a later step of a
    /// sequence sends them its trigger).
    pub state_triggers: Vec<String>,
    /// Outputs that are state: a sequence step keeps them on its stage.
    pub state_outputs: Vec<String>,
    /// Predicted time of one request from inputs to outputs, µs.
    pub predicted_latency_us: f64,
}

impl DeploymentRoute {
    /// The data address of worker `name`.
    pub fn addr_of(&self, name: &str) -> Option<&str> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .map(|h| h.data_addr.as_str())
    }
}

/// One worker of a deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRoute {
    pub name: String,
    pub data_addr: String,
}

/// A copy's load, from its workers' heartbeats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CopyLoad {
    /// Requests its subgraphs hold now (waiting, ready, computing).
    pub queued: u32,
    /// Sequences it keeps state for, and fresh ones waiting for room.
    pub sequences: u32,
    pub waiting: u32,
    /// Requests it finished per second, lately.
    pub rate: f64,
}

/// A network's graph inputs and outputs, in model order: what a requester
/// checks a request's inputs against, and what front doors describe.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    pub inputs: Vec<TensorSig>,
    pub outputs: Vec<TensorSig>,
}

/// A graph input's or output's name, element type and shape, as far as
/// they are known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSig {
    pub name: String,
    /// The ONNX element type number.
    pub elem: Option<i32>,
    pub shape: Option<Vec<Dim>>,
}

impl TensorSig {
    /// `f32[1,3,N]`, `?[..]`.
    pub fn type_string(&self) -> String {
        crate::graph::type_string(self.elem.map(ElemType), self.shape.as_deref())
    }
}

impl Signature {
    /// The graph's inputs and outputs.
    pub fn of(graph: &Graph) -> Signature {
        let sig = |&t| {
            let spec = graph.tensor(t);
            TensorSig {
                name: spec.name.clone(),
                elem: spec.elem_type.map(|e| e.0),
                shape: spec.shape.clone(),
            }
        };
        Signature {
            inputs: graph.inputs.iter().map(sig).collect(),
            outputs: graph.outputs.iter().map(sig).collect(),
        }
    }

    /// The input named `name`.
    pub fn input(&self, name: &str) -> Option<&TensorSig> {
        self.inputs.iter().find(|s| s.name == name)
    }

    /// Whether `inputs` are this network's: every input given, none
    /// unknown, each of its type and a shape that fits. The error says
    /// what is wrong.
    pub fn check(&self, inputs: &HashMap<String, Tensor>) -> Result<(), String> {
        for name in inputs.keys() {
            if self.input(name).is_none() {
                let names: Vec<&str> = self.inputs.iter().map(|s| s.name.as_str()).collect();
                return Err(format!(
                    "unknown input '{name}'; the inputs are: {}",
                    names.join(", ")
                ));
            }
        }
        for spec in &self.inputs {
            let given = inputs
                .get(&spec.name)
                .ok_or_else(|| format!("missing input '{}' ({})", spec.name, spec.type_string()))?;
            if spec.elem.is_some_and(|e| e != given.elem().0) {
                return Err(format!(
                    "input '{}' must be {}, got {}",
                    spec.name,
                    spec.type_string(),
                    given.elem()
                ));
            }
            if let Some(shape) = &spec.shape {
                let fits = shape.len() == given.shape().len()
                    && shape
                        .iter()
                        .zip(given.shape())
                        .all(|(d, &g)| d.known().is_none_or(|k| k == g as i64));
                if !fits {
                    return Err(format!(
                        "input '{}' must have shape {}, got {:?}",
                        spec.name,
                        spec.type_string(),
                        given.shape()
                    ));
                }
            }
        }
        Ok(())
    }
}
