//! `tessera-client`: the Rust SDK for a Tessera cluster.
//!
//! [`Client::connect`] dials the coordinator (QUIC, mutual TLS with a
//! certificate from the cluster CA); [`Client::load_network`] ships an ONNX
//! model, which the coordinator plans over the cluster's devices and
//! deploys, and returns a [`Network`] with its [`Plan`]. [`Network::infer`]
//! runs one request; [`Network::infer_many`] submits many at once
//! (pipelined through the workers) and returns their results in order.
//! Tensors convert from and to `ndarray` ([`tensor`]). Errors are a
//! [`ClientError`].
//!
//! Layout: this file (client, networks, requests), [`generate`] (model
//! folders and text generation), [`plan`] (the plan a load returns),
//! [`tensor`] (ndarray conversions).
//!
//! A runnable example against an embedded local cluster:
//! `cargo run --example sdk -p tessera-cli` (`cli/examples/sdk.rs`).
//!
//! # Example
//!
//! ```no_run
//! use tessera_client::{tensor, Client, LoadOptions};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let identity = tessera_net::certs::load_identity("certs".as_ref(), "client")?;
//! let client = Client::connect("127.0.0.1:7400".parse()?, &identity, "lab").await?;
//! let network = client
//!     .load_network(std::fs::read("model.onnx")?, LoadOptions::devices("HETERO:node-a/CPU,node-b/CPU"))
//!     .await?;
//! for sg in &network.plan().subgraphs {
//!     println!("subgraph {} on {}: {} nodes", sg.id, sg.device, sg.nodes.len());
//! }
//! let x = ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[1, 3, 32, 32]));
//! let outputs = network.infer(vec![("x".into(), tensor::from_array(&x)?)]).await?;
//! let y: ndarray::ArrayD<f32> = tensor::to_array(&outputs.tensors[0].1)?;
//! network.unload().await?;
//! # Ok(()) }
//! ```

mod error;
pub mod generate;
pub mod plan;
pub mod tensor;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
pub use tessera_common::affinity::Policy;
use tessera_common::tensor::Tensor;
use tessera_common::wire::client::{ClientReply, ClientRequest};
use tessera_common::wire::control::LoadRequest;
pub use tessera_common::wire::control::{
    Batching, Counters, DeviceAnswer, ModelState, ModelStatus, NodeTime, Replicas, Transfer,
    WorkerState,
};
use tessera_common::wire::handshake::Role;
use tessera_common::wire::tensor::TensorHeader;
use tessera_common::wire::Progress;
use tessera_common::wire::{Frame, Limits};
use tessera_net::certs::NodeIdentity;
use tessera_net::{exchange, recv_frame, send_frame, NetError, Node};

pub use error::{ClientError, Operation};
pub use plan::Plan;
pub use tessera_common::wire::control::ErrorKind;

/// How to load a network.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// A name for logs.
    pub name: String,
    /// Device priority, e.g. `HETERO:node-a/GPU,node-b/CPU`; a bare kind
    /// (`CPU`) means that kind on every worker; empty: every device.
    pub devices: String,
    /// `Priority` (first device in the list that supports a node) or
    /// `Cost` (cheapest by the workers' metrics and measured links).
    pub policy: Policy,
    /// Fail instead of falling back when a node's device cannot run it.
    pub strict: bool,
    /// Manual affinity: node name → device (`node-b/CPU`).
    pub affinity: Vec<(String, String)>,
    /// Concrete shapes of graph inputs (`--shape NAME=1,3,640,640`): the
    /// network is simplified for them (shape computations folded) and
    /// takes only inputs of these shapes. Empty: dynamic dims stay.
    pub shapes: Vec<(String, Vec<usize>)>,
    /// Copies of the network (`Count(1)` by default; `Auto`: as many, and
    /// as split, as the cost model predicts gives the most throughput);
    /// requests go to the copy with the least outstanding work.
    pub replicas: Replicas,
    /// Dynamic batching (off by default): requests waiting for a subgraph
    /// run as one batch along the first dimension, which must be dynamic.
    pub batching: Option<Batching>,
    /// A generative network's tokenizer and limits
    /// ([`generate::ModelFolder`]); it then answers [`Network::generate`].
    pub generation: Option<generate::GenerationSpec>,
}

impl LoadOptions {
    /// Options with a device priority and the defaults otherwise.
    pub fn devices(devices: &str) -> LoadOptions {
        LoadOptions {
            devices: devices.into(),
            ..Default::default()
        }
    }

    /// These options with `replicas` copies.
    pub fn replicas(mut self, replicas: Replicas) -> LoadOptions {
        self.replicas = replicas;
        self
    }

    /// These options with dynamic batching of up to `max_batch` requests,
    /// each waiting at most `max_queue_delay` for others.
    pub fn batching(mut self, max_batch: u32, max_queue_delay: Duration) -> LoadOptions {
        self.batching = Some(Batching {
            max_batch,
            max_queue_delay_us: max_queue_delay.as_micros() as u64,
        });
        self
    }
}

/// A request's results.
#[derive(Debug, Clone)]
pub struct Outputs {
    /// Graph outputs in model order.
    pub tensors: Vec<(String, Tensor)>,
    /// Compute time of each subgraph that ran, by subgraph id.
    pub subgraphs: Vec<(u32, Duration)>,
    /// Everything counted: per subgraph, per node (where the workers'
    /// plugins count per node: `PERF_COUNT`), per tensor moved.
    pub counters: Counters,
    /// The deployment that answered: a network that lost a worker is
    /// re-planned and gets a new one.
    pub deployment: u64,
    /// Tries it took: more than one when a worker it ran on was lost and
    /// the coordinator retried it on the new deployment.
    pub attempts: u32,
}

impl Outputs {
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
}

struct Inner {
    /// Keeps the endpoint alive.
    _node: Node,
    connection: quinn::Connection,
    limits: Limits,
}

/// A connection to a cluster's coordinator. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// A loaded network.
#[derive(Clone)]
pub struct Network {
    client: Client,
    id: u64,
    plan: Arc<Plan>,
    deadline: Option<Duration>,
}

impl Client {
    /// Dials the coordinator at `addr` of cluster `cluster`.
    pub async fn connect(
        addr: SocketAddr,
        identity: &NodeIdentity,
        cluster: &str,
    ) -> Result<Client, ClientError> {
        let any: SocketAddr = if addr.is_ipv6() {
            "[::]:0".parse()
        } else {
            "0.0.0.0:0".parse()
        }
        .map_err(|e: std::net::AddrParseError| ClientError::Connection(e.to_string()))?;
        let node =
            Node::bind(any, identity, cluster, Role::Client).map_err(ClientError::Connect)?;
        let peer = node.dial(addr).await.map_err(ClientError::Connect)?;
        Ok(Client {
            inner: Arc::new(Inner {
                limits: *node.limits(),
                connection: peer.connection,
                _node: node,
            }),
        })
    }

    /// A stream of its own for one request.
    async fn open(&self) -> Result<(quinn::SendStream, quinn::RecvStream), ClientError> {
        exchange::open(&self.inner.connection)
            .await
            .map_err(|e| ClientError::Connection(e.to_string()))
    }

    /// Ships `model` (ONNX bytes) and waits until it is deployed.
    pub async fn load_network(
        &self,
        model: impl Into<Bytes>,
        options: LoadOptions,
    ) -> Result<Network, ClientError> {
        self.load_network_with_progress(model, options, |_, _, _| {})
            .await
    }

    /// [`Client::load_network`], calling `progress(what, done, total)` as
    /// the coordinator reports it (QueryNetwork, compilation, deployment).
    pub async fn load_network_with_progress(
        &self,
        model: impl Into<Bytes>,
        options: LoadOptions,
        progress: impl FnMut(&str, u64, u64),
    ) -> Result<Network, ClientError> {
        let (request, model) = load_message(options, model.into(), false);
        let request = ClientRequest::LoadNetwork(request);
        let answer = self
            .operation(Operation::Load, &request, Some(model), progress)
            .await?;
        self.loaded(Operation::Load, answer)
    }

    /// The network a `NetworkLoaded` answer names.
    fn loaded(&self, op: Operation, answer: ClientReply) -> Result<Network, ClientError> {
        match answer {
            ClientReply::NetworkLoaded { network, plan } => Ok(Network {
                client: self.clone(),
                id: network,
                plan: Arc::new(*plan),
                deadline: None,
            }),
            other => Err(ClientError::unexpected(op, &other)),
        }
    }

    /// Loads `model` (ONNX bytes) as the named model `name` of the
    /// coordinator's repository (replacing a model of that name once the
    /// new one is deployed); requests by name (SDK, HTTP) then reach it,
    /// and it is re-planned by itself after a worker loss.
    pub async fn load_model(
        &self,
        name: &str,
        model: impl Into<Bytes>,
        options: LoadOptions,
        progress: impl FnMut(&str, u64, u64),
    ) -> Result<Network, ClientError> {
        let (request, model) = load_message(options, model.into(), false);
        self.model_operation(name, Some(request), Some(model), progress)
            .await
    }

    /// The network serving named model `name` (loading the repository's
    /// model of that name if it is not loaded).
    pub async fn model(&self, name: &str) -> Result<Network, ClientError> {
        self.model_operation(name, None, None, |_, _, _| {}).await
    }

    async fn model_operation(
        &self,
        name: &str,
        request: Option<LoadRequest>,
        model: Option<Bytes>,
        progress: impl FnMut(&str, u64, u64),
    ) -> Result<Network, ClientError> {
        let msg = ClientRequest::LoadModel {
            name: name.to_string(),
            request,
        };
        let answer = self
            .operation(Operation::LoadModel, &msg, model, progress)
            .await?;
        self.loaded(Operation::LoadModel, answer)
    }

    /// Unloads named model `name` (it stays in the repository, unloaded).
    pub async fn unload_model(&self, name: &str) -> Result<(), ClientError> {
        let op = Operation::UnloadModel;
        let msg = ClientRequest::UnloadModel { name: name.into() };
        match self.operation(op, &msg, None, |_, _, _| {}).await? {
            ClientReply::ModelUnloaded { .. } => Ok(()),
            other => Err(ClientError::unexpected(op, &other)),
        }
    }

    /// The named models of the coordinator's repository and their state.
    pub async fn models(&self) -> Result<Vec<ModelStatus>, ClientError> {
        let op = Operation::ListModels;
        match self
            .operation(op, &ClientRequest::ListModels, None, |_, _, _| {})
            .await?
        {
            ClientReply::Models { models } => Ok(models),
            other => Err(ClientError::unexpected(op, &other)),
        }
    }

    /// Plans `model` as [`Client::load_network`] would, deploying nothing:
    /// the partition, why each node went where, predicted costs.
    pub async fn plan(
        &self,
        model: impl Into<Bytes>,
        options: LoadOptions,
    ) -> Result<Plan, ClientError> {
        let op = Operation::Plan;
        let (request, model) = load_message(options, model.into(), true);
        let request = ClientRequest::LoadNetwork(request);
        match self
            .operation(op, &request, Some(model), |_, _, _| {})
            .await?
        {
            ClientReply::NetworkLoaded { plan, .. } => Ok(*plan),
            other => Err(ClientError::unexpected(op, &other)),
        }
    }

    /// QueryNetwork on every device of `devices` (a priority string; empty:
    /// every device): which nodes each `host/DEVICE` can run.
    pub async fn query(
        &self,
        model: impl Into<Bytes>,
        devices: &str,
    ) -> Result<Vec<DeviceAnswer>, ClientError> {
        let msg = ClientRequest::QueryNetwork {
            devices: vec![devices.to_string()],
        };
        let op = Operation::Query;
        match self
            .operation(op, &msg, Some(model.into()), |_, _, _| {})
            .await?
        {
            ClientReply::QueryResult { answers } => Ok(answers),
            other => Err(ClientError::unexpected(op, &other)),
        }
    }

    /// The cluster's workers, their devices and health.
    pub async fn cluster(&self) -> Result<ClusterState, ClientError> {
        let op = Operation::ClusterInfo;
        match self
            .operation(op, &ClientRequest::ClusterInfo, None, |_, _, _| {})
            .await?
        {
            ClientReply::ClusterState {
                workers,
                networks,
                in_flight,
            } => Ok(ClusterState {
                workers,
                networks,
                in_flight,
            }),
            other => Err(ClientError::unexpected(op, &other)),
        }
    }

    /// One operation on its own stream: the message (and payload), any
    /// progress, then the answer.
    async fn operation(
        &self,
        op: Operation,
        msg: &ClientRequest,
        payload: Option<Bytes>,
        mut progress: impl FnMut(&str, u64, u64),
    ) -> Result<ClientReply, ClientError> {
        let report = |p: Progress| progress(&p.what, p.done, p.total);
        let connection = &self.inner.connection;
        exchange::request(
            connection,
            msg,
            payload.as_ref(),
            &self.inner.limits,
            report,
        )
        .await
        .map_err(|e| ClientError::of(op, e))
    }
}

/// A load's message and payload: the model, and a generative network's
/// tokenizer after it.
fn load_message(options: LoadOptions, model: Bytes, dry_run: bool) -> (LoadRequest, Bytes) {
    let mut request = load_request(options, dry_run);
    let payload = match request.generation.as_mut() {
        Some(generation) => generation.join_payload(&model),
        None => model,
    };
    (request, payload)
}

fn load_request(options: LoadOptions, dry_run: bool) -> LoadRequest {
    LoadRequest {
        name: options.name,
        devices: options.devices,
        policy: options.policy,
        strict: options.strict,
        affinity: options.affinity,
        dry_run,
        shapes: options
            .shapes
            .into_iter()
            .map(|(name, dims)| (name, dims.into_iter().map(|d| d as u64).collect()))
            .collect(),
        replicas: options.replicas,
        batching: options.batching,
        generation: options.generation,
    }
}

/// The cluster as the coordinator sees it.
#[derive(Debug, Clone)]
pub struct ClusterState {
    pub workers: Vec<WorkerState>,
    /// Networks loaded.
    pub networks: u32,
    /// Requests running.
    pub in_flight: u32,
}

impl Network {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Subgraphs, devices and hosts.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Sets every later request's deadline (default: the coordinator's).
    pub fn with_deadline(mut self, deadline: Duration) -> Network {
        self.deadline = Some(deadline);
        self
    }

    /// Runs one request: every graph input by name.
    pub async fn infer(&self, inputs: Vec<(String, Tensor)>) -> Result<Outputs, ClientError> {
        let limits = self.client.inner.limits;
        let (mut send, mut recv) = self.client.open().await?;
        let msg = ClientRequest::Infer {
            network: self.id,
            request: 0,
            inputs: inputs.len() as u32,
            deadline_ms: self.deadline.map_or(0, |d| d.as_millis() as u64),
        };
        let io = |e: NetError| ClientError::Connection(e.to_string());
        exchange::send_message(&mut send, &msg, None, &limits)
            .await
            .map_err(io)?;
        for (name, t) in &inputs {
            let head = TensorHeader::new(self.id, 0, name, t)
                .encode(&limits)
                .map_err(|e| ClientError::Tensor(e.to_string()))?;
            send_frame(&mut send, &head, Some(&t.shared_bytes()))
                .await
                .map_err(io)?;
        }
        let _ = send.finish();
        let answer = exchange::answer::<ClientReply>(&mut recv, &limits, |_| {})
            .await
            .map_err(|e| ClientError::of(Operation::Infer, e))?;
        let (count, counters, deployment, attempts) = match answer {
            ClientReply::InferDone {
                outputs,
                counters,
                deployment,
                attempts,
                ..
            } => (outputs, counters, deployment, attempts),
            other => return Err(ClientError::unexpected(Operation::Infer, &other)),
        };
        let mut tensors = Vec::with_capacity(count as usize);
        for _ in 0..count {
            match recv_frame::<ClientReply>(&mut recv, &limits)
                .await
                .map_err(io)?
            {
                Some(Frame::Tensor(header, payload)) => {
                    let name = header.name.clone();
                    let t = header
                        .into_tensor(payload)
                        .map_err(|e| ClientError::Tensor(e.to_string()))?;
                    tensors.push((name, t));
                }
                other => return Err(ClientError::Protocol(format!("unexpected {other:?}"))),
            }
        }
        Ok(Outputs {
            tensors,
            subgraphs: counters
                .subgraphs
                .iter()
                .map(|&(sg, us)| (sg, Duration::from_micros(us)))
                .collect(),
            counters,
            deployment,
            attempts,
        })
    }

    /// Submits every request at once (they pipeline through the workers)
    /// and returns their results in the order given.
    pub async fn infer_many(
        &self,
        requests: Vec<Vec<(String, Tensor)>>,
    ) -> Vec<Result<Outputs, ClientError>> {
        let mut tasks = Vec::with_capacity(requests.len());
        for inputs in requests {
            let net = self.clone();
            tasks.push(tokio::spawn(async move { net.infer(inputs).await }));
        }
        let mut results = Vec::with_capacity(tasks.len());
        for t in tasks {
            results.push(
                t.await
                    .unwrap_or_else(|e| Err(ClientError::Protocol(format!("request task: {e}")))),
            );
        }
        results
    }

    /// Stops the network's subgraphs on the workers.
    pub async fn unload(self) -> Result<(), ClientError> {
        let op = Operation::Unload;
        let msg = ClientRequest::Unload { network: self.id };
        match self.client.operation(op, &msg, None, |_, _, _| {}).await? {
            ClientReply::Unloaded { .. } => Ok(()),
            other => Err(ClientError::unexpected(op, &other)),
        }
    }
}
