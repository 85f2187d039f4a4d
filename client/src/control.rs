//! The coordinator's control calls: loading networks and named models,
//! unloading named models, listing them, planning without deploying,
//! QueryNetwork and the cluster's state; each one operation on its own
//! stream, following the leader when a standby answers.

use std::sync::Arc;

use bytes::Bytes;
use tessera_common::wire::client::{ClientReply, ClientRequest};
use tessera_common::wire::control::{DeviceAnswer, LoadRequest, ModelStatus, WorkerState};
use tessera_common::wire::Progress;
use tessera_net::exchange;

use crate::options::{load_message, KNOWN_ABOVE};
use crate::{routes, Client, ClientError, LoadOptions, Network, Operation, Plan};
use tessera_common::wire::pieces::sha256_hex;

impl Client {
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
        let model: Bytes = model.into();
        let mut progress = progress;
        if model.len() >= KNOWN_ABOVE {
            let model_sha256 = match options.model_sha256.clone() {
                Some(sha) => sha,
                None => {
                    let of = model.clone();
                    tokio::task::spawn_blocking(move || sha256_hex(&of))
                        .await
                        .map_err(|e| ClientError::Model(format!("hashing the model failed: {e}")))?
                }
            };
            // The payload without the model: what follows it (a tokenizer).
            let (request, tail) = load_message(options.clone(), Bytes::new(), false);
            let ask = ClientRequest::LoadKnown {
                request,
                model_sha256,
            };
            match self
                .operation(Operation::Load, &ask, Some(tail), &mut progress)
                .await?
            {
                ClientReply::ModelUnknown => {}
                answer => return self.loaded(Operation::Load, answer, None).await,
            }
        }
        let (request, payload) = load_message(options, model, false);
        let request = ClientRequest::LoadNetwork(request);
        let answer = self
            .operation(Operation::Load, &request, Some(payload), progress)
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
    pub(crate) async fn operation(
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
