//! Requests: the inputs go straight to the workers whose subgraphs read
//! them; the final outputs come back from the workers that produce them.
//! A request completes when every graph output has arrived, fails when a
//! worker reports an error, and times out at its deadline (the error says
//! which outputs were still missing). Many requests are in flight at once;
//! each has its own id and result.
//!
//! A network with several copies (replicas) sends each request to the
//! ready copy with the least outstanding work: requests on it now × its
//! predicted latency ([`crate::network::Loaded::pick`]).
//!
//! The coordinator keeps a request's inputs until it completes: when a
//! worker it runs on is lost (or a tensor could not reach a worker that
//! then turns out lost), the request is tried again, with a new id, on
//! another copy or the copy's next deployment ([`crate::heal`]), within
//! the same deadline.
//! Outputs of an abandoned try are dropped, so a result is never
//! duplicated.
//!
//! A step of a sequence ([`infer_step`]) sends only the inputs that are
//! not state (unless it is fresh) and waits only for the outputs that are
//! not: each stage keeps its own. It is not retried here: its state was on
//! the lost worker, so the generator replays the sequence instead.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tessera_common::plan::{check_inputs, PlanError};
use tessera_common::tensor::Tensor;
use tessera_common::wire::cluster::ToWorker;
use tessera_common::wire::control::{Counters, NodeTime, Transfer};
use tessera_common::wire::generate::Steps;
use tessera_common::wire::tensor::{TensorHeader, TRIGGER};
use tessera_common::wire::Message;
use tokio::sync::{oneshot, Notify};

use crate::network::{Deployed, Picked, Waited};
use crate::{CoordinatorError, Shared};
use pending::TryState;
pub use tries::Outcome;
use tries::{Next, Settled, Tries, Verdict};

mod pending;
mod tries;

/// A finished request.
#[derive(Debug)]
pub struct Done {
    /// Graph outputs in model order.
    pub outputs: Vec<(String, Tensor)>,
    pub counters: Counters,
    /// The deployment that answered.
    pub deployment: u64,
    /// Tries it took.
    pub attempts: u32,
}

type Produced = Result<HashMap<String, Tensor>, Outcome>;

/// A try of a request in flight: its state, the channel its driver waits
/// on, and the signal that every subgraph has reported its timing.
pub struct Pending {
    state: TryState,
    done: Option<oneshot::Sender<Produced>>,
    reported: Arc<Notify>,
}

impl Pending {
    /// Sends what a transition settled the try with.
    fn settle(&mut self, result: Option<Produced>) {
        let Some(result) = result else { return };
        if let Some(done) = self.done.take() {
            let _ = done.send(result);
        }
    }
}

/// Runs one request on a loaded network, retrying it on the network's
/// next deployment when a worker is lost, until `deadline`.
/// Counted in the coordinator's metrics under the network's name.
#[tracing::instrument(level = "debug", skip(shared, inputs, deadline))]
pub async fn infer(
    shared: &Arc<Shared>,
    network: u64,
    inputs: HashMap<String, Tensor>,
    deadline: Option<Duration>,
) -> Result<Done, CoordinatorError> {
    infer_in(shared, network, inputs, deadline, None).await
}

/// Runs steps of sequences, one per row of `inputs` (see the module's
/// notes).
pub async fn infer_step(
    shared: &Arc<Shared>,
    network: u64,
    inputs: HashMap<String, Tensor>,
    steps: &Steps,
    deadline: Option<Duration>,
) -> Result<Done, CoordinatorError> {
    infer_in(shared, network, inputs, deadline, Some(steps)).await
}

async fn infer_in(
    shared: &Arc<Shared>,
    network: u64,
    inputs: HashMap<String, Tensor>,
    deadline: Option<Duration>,
    sequence: Option<&Steps>,
) -> Result<Done, CoordinatorError> {
    let Some(loaded) = shared.networks.get(&network).map(|n| n.clone()) else {
        let e = CoordinatorError::UnknownNetwork(network);
        shared
            .metrics
            .failed("", crate::metrics::failure_reason(&e));
        return Err(e);
    };
    let started = Instant::now();
    let _in_flight = shared.metrics.started(&loaded.name);
    let result = infer_on(shared, &loaded, inputs, deadline, sequence).await;
    match &result {
        Ok(done) => shared
            .metrics
            .succeeded(&loaded.name, started.elapsed(), &done.counters),
        Err(e) => shared
            .metrics
            .failed(&loaded.name, crate::metrics::failure_reason(e)),
    }
    result
}

async fn infer_on(
    shared: &Arc<Shared>,
    loaded: &crate::network::Loaded,
    inputs: HashMap<String, Tensor>,
    deadline: Option<Duration>,
    sequence: Option<&Steps>,
) -> Result<Done, CoordinatorError> {
    let network = loaded.id;
    // A later step lacks its state inputs by design.
    if sequence.is_none_or(Steps::fresh) {
        check_inputs(&loaded.graph, &inputs).map_err(|e| match e {
            PlanError::BadInput(m) => CoordinatorError::BadInput(m),
            e => CoordinatorError::Plan(e.to_string()),
        })?;
    }
    let deadline =
        deadline.unwrap_or_else(|| Duration::from_millis(shared.config.request_deadline_ms));
    let until = Instant::now() + deadline;
    // How long a lost peer takes to be noticed.
    let grace = Duration::from_millis(shared.config.worker_timeout_ms + shared.config.heartbeat_ms);
    let failed = |verdict: Verdict| match verdict {
        Verdict::Worker(e) => CoordinatorError::Worker(e),
        Verdict::WorkerLost(e) => CoordinatorError::WorkerLost(e),
        Verdict::Deadline { request, waiting } => CoordinatorError::Deadline {
            request,
            deadline_ms: deadline.as_millis() as u64,
            waiting,
        },
    };
    let mut tries = Tries::new(sequence.is_some(), loaded.replicas.len());
    loop {
        let (replica, deployed) = match loaded.pick(tries.tried(), until).await {
            Picked::Ready(r, d) => (r, d),
            Picked::Broken(e) => return Err(CoordinatorError::WorkerLost(e)),
            Picked::TimedOut => return Err(failed(tries.on_no_deployment(network))),
        };
        let _working = replica.start_work();
        let id = shared.next_request.fetch_add(1, Ordering::Relaxed);
        tries.start(id, deployed.id);
        let outcome = match attempt_on(shared, &deployed, id, &inputs, sequence, until).await {
            Ok((outputs, counters)) => {
                return Ok(Done {
                    outputs,
                    counters,
                    deployment: deployed.id,
                    attempts: tries.attempts(),
                })
            }
            Err(outcome) => outcome,
        };
        let mut next = tries.on_outcome(outcome);
        if next == Next::AwaitLoss {
            // Until the copy's deployment changes (its worker was lost)
            // or the loss would have been noticed.
            let wait = until.min(Instant::now() + grace);
            next = tries.on_settled(match replica.ready(Some(deployed.id), wait).await {
                Waited::Ready(_) => Settled::Redeployed,
                Waited::Broken(why) => Settled::Broken(why),
                Waited::TimedOut => Settled::Unchanged,
            });
        }
        match next {
            Next::Retry => tracing::info!(network, request = id, "retrying: {}", tries.last()),
            Next::Fail(verdict) => return Err(failed(verdict)),
            Next::AwaitLoss => return Err(CoordinatorError::WorkerLost(tries.last().into())),
        }
    }
}

/// One try of a request on one deployment, as request `id`.
#[tracing::instrument(level = "debug", skip_all, fields(request = id, deployment = net.id))]
async fn attempt_on(
    shared: &Arc<Shared>,
    net: &Deployed,
    id: u64,
    inputs: &HashMap<String, Tensor>,
    sequence: Option<&Steps>,
    until: Instant,
) -> Result<(Vec<(String, Tensor)>, Counters), Outcome> {
    let (tx, rx) = oneshot::channel();
    // A step of a sequence leaves its state outputs on their stages.
    let wanted: Vec<&String> = net
        .outputs
        .iter()
        .filter(|o| sequence.is_none() || !net.state_outputs.contains(o))
        .collect();
    let computed: Vec<String> = wanted
        .iter()
        .filter(|o| !inputs.contains_key(**o))
        .map(|o| (*o).clone())
        .collect();
    // Registered before the workers are checked: a loss from here on
    // fails it (and it is retried).
    let reported = Arc::new(Notify::new());
    shared.pending.insert(
        id,
        Pending {
            state: TryState::new(net.hosts.clone(), computed.clone(), net.placements.len()),
            done: Some(tx),
            reported: reported.clone(),
        },
    );
    let run = async {
        if let Some(gone) = net.hosts.iter().find(|h| !shared.workers.contains_key(*h)) {
            return Err(Outcome::Lost(format!("worker {gone} is not connected")));
        }
        if computed.is_empty() {
            return Ok(HashMap::new());
        }
        send_inputs(shared, net, id, inputs, sequence).await?;
        let produced = rx
            .await
            .map_err(|_| Outcome::Error("the request was dropped".into()))
            .and_then(|r| r)?;
        reports(shared, id, &reported).await;
        Ok(produced)
    };
    let result = tokio::time::timeout_at(tokio::time::Instant::from_std(until), run).await;
    let pending = shared.pending.remove(&id).map(|(_, p)| p);
    let outcome = match result {
        Ok(Ok(mut produced)) => {
            let outputs = wanted
                .iter()
                .map(|&name| {
                    produced
                        .remove(name)
                        .or_else(|| inputs.get(name).cloned())
                        .map(|t| (name.clone(), t))
                        .ok_or_else(|| format!("output '{name}' was not produced"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(Outcome::Error)?;
            let counters = pending.map(|p| p.state.into_counters()).unwrap_or_default();
            tracing::debug!(outputs = outputs.len(), "done");
            return Ok((outputs, counters));
        }
        Ok(Err(failure)) => {
            tracing::debug!("failed: {failure:?}");
            failure
        }
        Err(_) => Outcome::Deadline(
            pending
                .as_ref()
                .filter(|p| !p.state.missing().is_empty())
                .map(|p| format!(" (still waiting for {})", p.state.missing().join(", ")))
                .unwrap_or_default(),
        ),
    };
    cancel(shared, id, &net.hosts).await;
    Err(outcome)
}

/// Sends a request's trigger to the hosts of subgraphs without inputs and
/// each graph input to the workers that read it.
async fn send_inputs(
    shared: &Shared,
    net: &Deployed,
    id: u64,
    inputs: &HashMap<String, Tensor>,
    sequence: Option<&Steps>,
) -> Result<(), Outcome> {
    let network = net.id;
    let link_to = |host: &str| {
        let link = shared.workers.get(host).map(|w| w.tensors.clone());
        link.ok_or_else(|| Outcome::Lost(format!("worker {host} is not connected")))
    };
    let unreachable = |what: String| Outcome::Unreachable(what);
    let trigger = Tensor::new(tessera_common::onnx::ElemType::UINT8, vec![0], Vec::new())
        .map_err(|e| Outcome::Error(e.to_string()))?;
    // A later step also triggers the subgraphs that read only state.
    let mut triggered = net.trigger_hosts.clone();
    if sequence.is_some_and(|s| !s.fresh()) {
        for host in &net.state_trigger_hosts {
            if !triggered.contains(host) {
                triggered.push(host.clone());
            }
        }
    }
    for host in &triggered {
        link_to(host)?
            .send_step_tensor(network, id, sequence, TRIGGER, &trigger)
            .await
            .map_err(|e| unreachable(format!("triggering {host}: {e}")))?;
    }
    for (name, hosts) in &net.input_routes {
        let Some(tensor) = inputs.get(name) else {
            continue;
        };
        for host in hosts {
            link_to(host)?
                .send_step_tensor(network, id, sequence, name, tensor)
                .await
                .map_err(|e| unreachable(format!("sending input '{name}' to {host}: {e}")))?;
            tracing::debug!(input = %name, to = %host, "sent");
        }
    }
    Ok(())
}

/// Tells the workers to drop what a failed request left behind.
async fn cancel(shared: &Arc<Shared>, request: u64, hosts: &[String]) {
    for host in hosts {
        let Some(conn) = shared.workers.get(host).map(|w| w.connection.clone()) else {
            continue;
        };
        let limits = *shared.node.limits();
        tokio::spawn(async move {
            if let Ok((mut send, _recv)) = conn.open_bi().await {
                if let Ok(head) = (ToWorker::Cancel { request }).encode(0, &limits) {
                    let _ = tessera_net::send_frame(&mut send, &head, None).await;
                    let _ = send.finish();
                }
            }
        });
    }
}

/// Tells the hosts of every deployment of `network` that `sequence` ended,
/// so that its stages free its state.
pub async fn end_sequence(shared: &Arc<Shared>, network: u64, sequence: u64) {
    let Some(loaded) = shared.networks.get(&network).map(|n| n.clone()) else {
        return;
    };
    let limits = *shared.node.limits();
    for deployed in loaded.deployments() {
        for host in &deployed.hosts {
            let Some(conn) = shared.workers.get(host).map(|w| w.connection.clone()) else {
                continue;
            };
            let msg = ToWorker::EndSequence {
                network: deployed.id,
                sequence,
            };
            tokio::spawn(async move {
                if let Ok((mut send, _recv)) = conn.open_bi().await {
                    if let Ok(head) = msg.encode(0, &limits) {
                        let _ = tessera_net::send_frame(&mut send, &head, None).await;
                        let _ = send.finish();
                    }
                }
            });
        }
    }
}

/// Waits briefly for every subgraph's `Ran` report of request `id`: each
/// worker sends its report to the coordinator on its own connection, and
/// a stage early in a pipeline can be heard after the last stage's
/// outputs (seen on a loaded machine). They nearly always have arrived.
async fn reports(shared: &Shared, id: u64, reported: &Notify) {
    const GRACE: Duration = Duration::from_millis(25);
    if shared
        .pending
        .get(&id)
        .is_some_and(|p| !p.state.all_reported())
    {
        // The last report's signal is kept if it came in between.
        let _ = tokio::time::timeout(GRACE, reported.notified()).await;
    }
}

/// A final output from worker `from`, which took `took` to arrive.
pub fn output_arrived(
    shared: &Shared,
    from: &str,
    header: TensorHeader,
    payload: Bytes,
    took: Duration,
) {
    let request = header.request;
    let name = header.name.clone();
    let bytes = payload.len() as u64;
    let tensor = match header.into_tensor(payload) {
        Ok(t) => t,
        Err(e) => {
            let error = format!("bad output tensor from {from}: {e}");
            return fail(shared, request, Outcome::Error(error));
        }
    };
    tracing::debug!(request, tensor = %name, %from, bytes, "output arrived");
    let Some(mut p) = shared.pending.get_mut(&request) else {
        tracing::debug!(request, "output of a finished request");
        return;
    };
    let transfer = Transfer {
        request,
        tensor: name.clone(),
        from: from.into(),
        to: shared.config.name.clone(),
        bytes,
        micros: took.as_micros() as u64,
    };
    let settled = p.state.on_output(name, tensor, transfer).map(Ok);
    p.settle(settled);
}

/// A subgraph's compute time (and its nodes') for a request.
pub fn ran(shared: &Shared, request: u64, subgraph: u32, micros: u64, nodes: Vec<NodeTime>) {
    if let Some(mut p) = shared.pending.get_mut(&request) {
        if p.state.on_ran(subgraph, micros, nodes) {
            p.reported.notify_one();
        }
    }
}

/// A tensor of a request moved between workers (or to one).
pub fn moved(shared: &Shared, transfer: Transfer) {
    if let Some(mut p) = shared.pending.get_mut(&transfer.request) {
        p.state.on_moved(transfer);
    }
}

/// Fails a try of a request.
pub fn fail(shared: &Shared, request: u64, failure: Outcome) {
    if let Some(mut p) = shared.pending.get_mut(&request) {
        let settled = p.state.on_failure(failure).map(Err);
        p.settle(settled);
    }
}

/// Fails every try that runs on `worker`, which was lost.
pub fn fail_on_worker(shared: &Shared, worker: &str, error: &str) {
    for mut p in shared.pending.iter_mut() {
        if p.state.runs_on(worker) {
            let settled = p
                .state
                .on_failure(Outcome::Lost(error.to_string()))
                .map(Err);
            p.settle(settled);
        }
    }
}
