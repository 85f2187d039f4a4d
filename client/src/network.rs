//! A loaded network's handle: its plan and routing table, requests run
//! through the data path (one, or many pipelined), their results, and
//! unloading it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_common::tensor::Tensor;
use tessera_common::wire::client::{ClientReply, ClientRequest};
use tessera_common::wire::control::Counters;
use tessera_common::wire::routes::RoutingTable;

use crate::{embed, generate, infer, routes, Client, ClientError, Operation, Plan};

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

/// A loaded network.
#[derive(Clone)]
pub struct Network {
    pub(crate) client: Client,
    pub(crate) id: u64,
    pub(crate) plan: Arc<Plan>,
    pub(crate) routes: routes::Routes,
    pub(crate) deadline: Option<Duration>,
    pub(crate) counters: bool,
    /// A generative network's tokenizer and batching, made on first use.
    pub(crate) generator: Arc<tokio::sync::OnceCell<Arc<generate::Generator>>>,
    /// An embedding network's tokenizer and pooling, made on first use.
    pub(crate) embedder: Arc<tokio::sync::OnceCell<Arc<embed::Embedder>>>,
}

/// How long a request may take by default (its retries included).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

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
