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
//! The client is a requester: the coordinator only loads and plans, and
//! publishes each network's routing table ([`routes`]); requests go from
//! the client straight to the workers of the copy it picks, and their
//! outputs come straight back ([`infer`]), with the same certificate. The
//! client retries on another copy when a worker is lost. Requests and
//! generations go on while the coordinator is away (the last table stays);
//! the client dials it again when it comes back.
//!
//! Layout: this file (client, networks, control operations), [`routes`]
//! (routing-table subscription, picking a copy), [`infer`] (the request
//! path), [`peers`] (connections to workers), [`generate`] (model folders
//! and text generation: tokenizer, batching, the generation loop),
//! [`plan`] (the plan a load returns), [`tensor`] (ndarray conversions).
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

pub mod embed;
mod error;
pub mod generate;
pub mod infer;
pub mod leader;
pub mod peers;
pub mod plan;
pub mod routes;
pub mod tensor;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
pub use tessera_common::affinity::Policy;
use tessera_common::tensor::Tensor;
use tessera_common::wire::client::{ClientReply, ClientRequest};
pub use tessera_common::wire::control::LoadRequest;
pub use tessera_common::wire::control::{
    Batching, Counters, DeviceAnswer, ModelState, ModelStatus, NodeTime, Replicas, Transfer,
    WorkerState,
};
use tessera_common::wire::handshake::Role;
use tessera_common::wire::routes::RoutingTable;
use tessera_common::wire::Limits;
use tessera_common::wire::Progress;
use tessera_net::certs::NodeIdentity;
use tessera_net::{exchange, Node};

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
    /// An embedding model (`/v1/embeddings`, [`Network::embed`]): its
    /// tokenizer (`tokenizer_json`) and pooling.
    pub embedding: Option<tessera_common::wire::embed::EmbeddingSpec>,
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
    /// The endpoint: the coordinator's connection and every worker's.
    node: Arc<Node>,
    /// The coordinators' addresses (HA: several, the leader is found
    /// among them), dialled again when the connection closed.
    coordinators: Vec<SocketAddr>,
    connection: Mutex<quinn::Connection>,
    limits: Limits,
    /// The requester's name (its certificate's).
    name: String,
    peers: peers::Peers,
    ids: infer::Ids,
    /// Serialises dialling the coordinator again.
    redial: tokio::sync::Mutex<()>,
}

/// A connection to a cluster: its coordinator (loads, plans, routing
/// tables) and, for requests, its workers. Cheap to clone.
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
    routes: routes::Routes,
    deadline: Option<Duration>,
    counters: bool,
    /// A generative network's tokenizer and batching, made on first use.
    generator: Arc<tokio::sync::OnceCell<Arc<generate::Generator>>>,
    /// An embedding network's tokenizer and pooling, made on first use.
    embedder: Arc<tokio::sync::OnceCell<Arc<embed::Embedder>>>,
}

/// How long a request may take by default (its retries included).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

impl Client {
    /// Dials the coordinator at `addr` of cluster `cluster` as a client.
    pub async fn connect(
        addr: SocketAddr,
        identity: &NodeIdentity,
        cluster: &str,
    ) -> Result<Client, ClientError> {
        Client::connect_as(addr, identity, cluster, Role::Client).await
    }

    /// Dials the coordinator with an identity of `role` (a front door on a
    /// worker, or on the coordinator itself, is a requester with its own
    /// certificate).
    pub async fn connect_as(
        addr: SocketAddr,
        identity: &NodeIdentity,
        cluster: &str,
        role: Role,
    ) -> Result<Client, ClientError> {
        Client::connect_any(&[addr], identity, cluster, role).await
    }

    /// Connects to the leading coordinator of `addrs` (HA: every
    /// coordinator; one address works as [`Client::connect_as`]), and
    /// follows the leader from then on.
    pub async fn connect_any(
        addrs: &[SocketAddr],
        identity: &NodeIdentity,
        cluster: &str,
        role: Role,
    ) -> Result<Client, ClientError> {
        let Some(first) = addrs.first() else {
            return Err(ClientError::Connection("no coordinator address".into()));
        };
        let any: SocketAddr = if first.is_ipv6() {
            "[::]:0".parse()
        } else {
            "0.0.0.0:0".parse()
        }
        .map_err(|e: std::net::AddrParseError| ClientError::Connection(e.to_string()))?;
        let node =
            Arc::new(Node::bind(any, identity, cluster, role).map_err(ClientError::Connect)?);
        let connection = leader::find(&node, addrs).await?;
        Ok(Client {
            inner: Arc::new(Inner {
                limits: *node.limits(),
                connection: Mutex::new(connection),
                coordinators: addrs.to_vec(),
                name: identity.name.clone(),
                peers: peers::Peers::new(node.clone()),
                ids: infer::Ids::new(),
                redial: tokio::sync::Mutex::new(()),
                node,
            }),
        })
    }

    /// The coordinator's connection now.
    pub(crate) fn connection(&self) -> quinn::Connection {
        match self.inner.connection.lock() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    pub(crate) fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// The coordinator of the connection stands by (HA): the next
    /// operation finds the leader.
    pub(crate) fn not_leader(&self) {
        self.connection().close(0u32.into(), b"not the leader");
    }

    /// Dials the coordinator (the leader) again if its connection closed.
    pub(crate) async fn reconnect_if_closed(&self) {
        let _one = self.inner.redial.lock().await;
        if self.connection().close_reason().is_none() {
            return;
        }
        match leader::find(&self.inner.node, &self.inner.coordinators).await {
            Ok(connection) => {
                if let Ok(mut c) = self.inner.connection.lock() {
                    *c = connection;
                }
                tracing::info!("connected to the coordinator again");
            }
            Err(e) => tracing::debug!("the coordinator is still away: {e}"),
        }
    }

    /// Bytes of frames this requester received from workers so far, and
    /// what the connections to them received on the wire (QUIC datagrams
    /// whole): what the data path brings back.
    pub async fn data_received(&self) -> (u64, u64) {
        let peers = &self.inner.peers;
        (peers.received(), peers.received_on_the_wire().await)
    }

    /// A stream of its own for one operation.
    async fn open(&self) -> Result<(quinn::SendStream, quinn::RecvStream), ClientError> {
        self.reconnect_if_closed().await;
        exchange::open(&self.connection())
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
        self.loaded(Operation::Load, answer, None).await
    }

    /// The network a `NetworkLoaded` answer names, its routing table
    /// followed (by network, or by `model`'s name).
    async fn loaded(
        &self,
        op: Operation,
        answer: ClientReply,
        model: Option<&str>,
    ) -> Result<Network, ClientError> {
        match answer {
            ClientReply::NetworkLoaded { network, plan } => {
                let routes =
                    routes::Routes::subscribe(self, network, model.map(str::to_string)).await?;
                Ok(Network {
                    client: self.clone(),
                    id: network,
                    plan: Arc::new(*plan),
                    routes,
                    deadline: None,
                    counters: false,
                    generator: Default::default(),
                    embedder: Default::default(),
                })
            }
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
        self.loaded(Operation::LoadModel, answer, Some(name)).await
    }

    /// Loads named model `name` as `request` says, its model (and a
    /// generative network's tokenizer) the payload; with a request but no
    /// payload, the model's bytes as the coordinator has them, placed
    /// anew; with neither, the repository's model as it is.
    pub async fn load_model_with(
        &self,
        name: &str,
        request: Option<LoadRequest>,
        payload: Option<Bytes>,
    ) -> Result<Network, ClientError> {
        self.model_operation(name, request, payload, |_, _, _| {})
            .await
    }

    /// The network serving named model `name` now, following it (a model
    /// loaded again continues on its new network); never loads it: a model
    /// not deployed is an error.
    pub async fn serving(&self, name: &str) -> Result<Network, ClientError> {
        let routes = routes::Routes::subscribe(self, 0, Some(name.to_string())).await?;
        let id = routes.table().map_or(0, |t| t.network);
        Ok(Network {
            client: self.clone(),
            id,
            plan: Arc::new(Plan::default()),
            routes,
            deadline: None,
            counters: false,
            generator: Default::default(),
            embedder: Default::default(),
        })
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

    /// Loaded network `network`'s plan: where each copy's subgraphs run,
    /// with what their workers measured of their runs.
    pub async fn loaded_plan(&self, network: u64) -> Result<Plan, ClientError> {
        let op = Operation::Plan;
        match self
            .operation(op, &ClientRequest::Plan { network }, None, |_, _, _| {})
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
                coordinators,
            } => Ok(ClusterState {
                workers,
                networks,
                in_flight,
                coordinators,
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
        let mut report = |p: Progress| progress(&p.what, p.done, p.total);
        // A standby's answer names the leader: the operation goes there
        // (a leader is searched for at most once per try).
        let mut tries = 0;
        loop {
            self.reconnect_if_closed().await;
            let reply = exchange::request(
                &self.connection(),
                msg,
                payload.as_ref(),
                &self.inner.limits,
                &mut report,
            )
            .await
            .map_err(|e| ClientError::of(op, e))?;
            tries += 1;
            match reply {
                ClientReply::NotLeader { leader } if tries < 3 => {
                    tracing::debug!(?leader, "the coordinator stands by: finding the leader");
                    self.not_leader();
                }
                reply => return Ok(reply),
            }
        }
    }
}

/// A load's message and payload: the model, and a generative or embedding
/// network's tokenizer after it.
fn load_message(options: LoadOptions, model: Bytes, dry_run: bool) -> (LoadRequest, Bytes) {
    let mut request = load_request(options, dry_run);
    let payload = match (request.generation.as_mut(), request.embedding.as_mut()) {
        (Some(generation), _) => generation.join_payload(&model),
        (None, Some(embedding)) => embedding.join_payload(&model),
        (None, None) => model,
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
        embedding: options.embedding,
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
    /// The coordinators: the leader first, then the standbys.
    pub coordinators: Vec<tessera_common::wire::control::CoordinatorInfo>,
}

impl Network {
    /// The network's id now (a named model loaded again serves on a new
    /// network).
    pub fn id(&self) -> u64 {
        self.routes.table().map_or(self.id, |t| t.network)
    }

    /// Subgraphs, devices and hosts.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Its routing table now.
    pub fn routes(&self) -> Option<Arc<RoutingTable>> {
        self.routes.table()
    }

    /// Waits until its routing table changes or `until` passes; false if
    /// it did not (or the network is gone).
    pub(crate) async fn routes_changed(&self, until: Instant) -> bool {
        self.routes.changed(until).await
    }

    /// Why it no longer serves (unloaded), if so.
    pub fn gone(&self) -> Option<String> {
        self.routes.gone()
    }

    /// The same network without its generator (what its generator's own
    /// tasks hold: no cycle keeps them alive).
    pub(crate) fn detached(&self) -> Network {
        Network {
            generator: Default::default(),
            ..self.clone()
        }
    }

    /// Sets every later request's deadline (default: 30 s).
    pub fn with_deadline(mut self, deadline: Duration) -> Network {
        self.deadline = Some(deadline);
        self
    }

    /// Every later request also counts time per node (where the workers'
    /// plugins do: `PERF_COUNT`) and every tensor moved.
    pub fn with_counters(mut self, counters: bool) -> Network {
        self.counters = counters;
        self
    }

    fn until(&self) -> Instant {
        Instant::now() + self.deadline.unwrap_or(DEFAULT_DEADLINE)
    }

    /// Runs one request: every graph input by name. It goes straight to
    /// the workers of the copy with the least outstanding work, and is
    /// retried on another when a worker is lost.
    pub async fn infer(&self, inputs: Vec<(String, Tensor)>) -> Result<Outputs, ClientError> {
        let inputs: HashMap<String, Tensor> = inputs.into_iter().collect();
        let request = infer::Request {
            inputs: &inputs,
            sequence: None,
            sampling: &[],
            counters: self.counters,
            until: self.until(),
            copy: None,
        };
        let done = self.run(request).await?;
        let order: Vec<String> = self.routes.table().map_or_else(Vec::new, |t| {
            t.signature.outputs.iter().map(|o| o.name.clone()).collect()
        });
        let mut outputs = done.outputs;
        let tensors = order
            .into_iter()
            .filter_map(|name| outputs.remove(&name).map(|t| (name, t)))
            .collect();
        Ok(Outputs {
            tensors,
            subgraphs: done
                .counters
                .subgraphs
                .iter()
                .map(|&(sg, us)| (sg, Duration::from_micros(us)))
                .collect(),
            counters: done.counters,
            deployment: done.deployment,
            attempts: done.attempts,
        })
    }

    /// One request or sequence step through the data path.
    pub(crate) async fn run(
        &self,
        request: infer::Request<'_>,
    ) -> Result<infer::Done, ClientError> {
        let inner = &self.client.inner;
        infer::run(
            &self.routes,
            &inner.peers,
            &inner.ids,
            &inner.limits,
            &inner.name,
            request,
        )
        .await
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
        let msg = ClientRequest::Unload { network: self.id() };
        match self.client.operation(op, &msg, None, |_, _, _| {}).await? {
            ClientReply::Unloaded { .. } => Ok(()),
            other => Err(ClientError::unexpected(op, &other)),
        }
    }
}
