//! Requests: the inputs go straight to the workers whose subgraphs read
//! them; the final outputs come back from the workers that produce them.
//! A request completes when every graph output has arrived, fails when a
//! worker reports an error or is lost, and times out at its deadline (the
//! error says which outputs were still missing). Many requests are in
//! flight at once; each has its own id and result.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tessera_common::plan::{check_inputs, PlanError};
use tessera_common::tensor::Tensor;
use tessera_common::wire::control::{Control, Counters, NodeTime, Transfer};
use tessera_common::wire::tensor::TensorHeader;
use tokio::sync::oneshot;

use crate::{CoordinatorError, Shared};

/// The tensor name that triggers a worker's subgraphs without inputs (the
/// worker's `daemon::actor::TRIGGER`).
const TRIGGER: &str = "";

/// A finished request.
#[derive(Debug)]
pub struct Done {
    /// Graph outputs in model order.
    pub outputs: Vec<(String, Tensor)>,
    pub counters: Counters,
}

/// A request in flight.
pub struct Pending {
    pub network: u64,
    /// Workers it runs on.
    pub hosts: Vec<String>,
    /// Graph outputs still to come.
    missing: Vec<String>,
    outputs: HashMap<String, Tensor>,
    counters: Counters,
    done: Option<oneshot::Sender<Result<HashMap<String, Tensor>, String>>>,
}

/// Runs one request on a loaded network.
pub async fn infer(
    shared: &Arc<Shared>,
    network: u64,
    inputs: HashMap<String, Tensor>,
    deadline: Option<Duration>,
) -> Result<Done, CoordinatorError> {
    let net = shared
        .networks
        .get(&network)
        .map(|n| n.clone())
        .ok_or(CoordinatorError::UnknownNetwork(network))?;
    check_inputs(&net.graph, &inputs).map_err(|e| match e {
        PlanError::BadInput(m) => CoordinatorError::BadInput(m),
        e => CoordinatorError::Plan(e.to_string()),
    })?;
    for host in &net.hosts {
        if !shared.workers.contains_key(host) {
            return Err(CoordinatorError::Worker(format!(
                "network {network} runs on worker {host}, which is not connected"
            )));
        }
    }
    let id = shared.next_request.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    let computed: Vec<String> = net
        .outputs
        .iter()
        .filter(|o| !inputs.contains_key(*o))
        .cloned()
        .collect();
    shared.pending.insert(
        id,
        Pending {
            network,
            hosts: net.hosts.clone(),
            missing: computed.clone(),
            outputs: HashMap::new(),
            counters: Counters::default(),
            done: Some(tx),
        },
    );
    let deadline =
        deadline.unwrap_or_else(|| Duration::from_millis(shared.config.request_deadline_ms));
    let run = async {
        if computed.is_empty() {
            return Ok(HashMap::new());
        }
        let trigger = Tensor::new(tessera_common::onnx::ElemType::UINT8, vec![0], Vec::new())
            .map_err(|e| e.to_string())?;
        for host in &net.trigger_hosts {
            let link = shared.workers.get(host).map(|w| w.tensors.clone());
            let Some(link) = link else {
                return Err(format!("worker {host} is not connected"));
            };
            link.send_tensor(network, id, TRIGGER, &trigger)
                .await
                .map_err(|e| format!("triggering {host}: {e}"))?;
        }
        for (name, hosts) in &net.input_routes {
            let Some(tensor) = inputs.get(name) else {
                continue;
            };
            for host in hosts {
                let worker = shared.workers.get(host).map(|w| w.tensors.clone());
                let Some(link) = worker else {
                    return Err(format!("worker {host} is not connected"));
                };
                link.send_tensor(network, id, name, tensor)
                    .await
                    .map_err(|e| format!("sending input '{name}' to {host}: {e}"))?;
            }
        }
        rx.await
            .map_err(|_| "the request was dropped".to_string())
            .and_then(|r| r)
    };
    let result = tokio::time::timeout(deadline, run).await;
    let pending = shared.pending.remove(&id).map(|(_, p)| p);
    let outcome = match result {
        Ok(Ok(mut produced)) => {
            let outputs = net
                .outputs
                .iter()
                .map(|name| {
                    produced
                        .remove(name)
                        .or_else(|| inputs.get(name).cloned())
                        .map(|t| (name.clone(), t))
                        .ok_or_else(|| {
                            CoordinatorError::Worker(format!("output '{name}' was not produced"))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut counters = pending.map(|p| p.counters).unwrap_or_default();
            counters.subgraphs.sort_unstable();
            return Ok(Done { outputs, counters });
        }
        Ok(Err(e)) => CoordinatorError::Worker(e),
        Err(_) => CoordinatorError::Deadline {
            request: id,
            deadline_ms: deadline.as_millis() as u64,
            waiting: pending
                .as_ref()
                .filter(|p| !p.missing.is_empty())
                .map(|p| format!(" (still waiting for {})", p.missing.join(", ")))
                .unwrap_or_default(),
        },
    };
    cancel(shared, id, &net.hosts).await;
    Err(outcome)
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
                if let Ok(head) = (Control::Cancel { request }).encode(0, &limits) {
                    let _ = tessera_net::send_frame(&mut send, &head, None).await;
                    let _ = send.finish();
                }
            }
        });
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
        Err(e) => return fail(shared, request, format!("bad output tensor: {e}")),
    };
    let Some(mut p) = shared.pending.get_mut(&request) else {
        tracing::debug!(request, "output of a finished request");
        return;
    };
    p.counters.transfers.push(Transfer {
        request,
        tensor: name.clone(),
        from: from.into(),
        to: shared.config.name.clone(),
        bytes,
        micros: took.as_micros() as u64,
    });
    p.missing.retain(|m| *m != name);
    p.outputs.insert(name, tensor);
    if p.missing.is_empty() {
        let outputs = std::mem::take(&mut p.outputs);
        if let Some(done) = p.done.take() {
            let _ = done.send(Ok(outputs));
        }
    }
}

/// A subgraph's compute time (and its nodes') for a request.
pub fn ran(shared: &Shared, request: u64, subgraph: u32, micros: u64, nodes: Vec<NodeTime>) {
    if let Some(mut p) = shared.pending.get_mut(&request) {
        p.counters.subgraphs.push((subgraph, micros));
        p.counters
            .nodes
            .extend(nodes.into_iter().map(|n| (subgraph, n)));
    }
}

/// A tensor of a request moved between workers (or to one).
pub fn moved(shared: &Shared, transfer: Transfer) {
    if let Some(mut p) = shared.pending.get_mut(&transfer.request) {
        p.counters.transfers.push(transfer);
    }
}

/// Fails a request.
pub fn fail(shared: &Shared, request: u64, error: String) {
    if let Some(mut p) = shared.pending.get_mut(&request) {
        if let Some(done) = p.done.take() {
            let _ = done.send(Err(error));
        }
    }
}

/// Fails every request that runs on `worker`.
pub fn fail_on_worker(shared: &Shared, worker: &str, error: &str) {
    for mut p in shared.pending.iter_mut() {
        if p.hosts.iter().any(|h| h == worker) {
            if let Some(done) = p.done.take() {
                let _ = done.send(Err(error.to_string()));
            }
        }
    }
}
