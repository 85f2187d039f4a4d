//! The request path, at the requester: a request goes straight to the
//! workers of the copy it picks from the routing table, and its outputs
//! come straight back from the workers that make them; the coordinator
//! takes no part. One try opens a stream to every worker of the copy
//! (`Open`, then the tensors that worker reads) and gathers what each
//! answers into the try's state ([`tessera_common::requests::pending`]);
//! the tries' rules ([`tessera_common::requests::tries`]) decide what
//! happens after a failure: retry on another copy, wait to learn from the
//! routing table whether a worker was lost, or fail.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tessera_common::onnx::ElemType;
use tessera_common::requests::pending::TryState;
use tessera_common::requests::tries::{Next, Outcome, Tries, Verdict};
use tessera_common::tensor::Tensor;
use tessera_common::wire::control::{Counters, ErrorKind, Transfer};
use tessera_common::wire::data::{DataReply, DataRequest, Open, SampledToken, Sampling};
use tessera_common::wire::generate::Steps;
use tessera_common::wire::routes::{CopyState, DeploymentRoute, RoutingTable};
use tessera_common::wire::tensor::{TensorHeader, TRIGGER};
use tessera_common::wire::{Failure, Frame, Limits, Message};
use tessera_net::{exchange, recv_frame_shared, send_frame_shared};
use tokio::sync::mpsc;

use crate::peers::Peers;
use crate::routes::{Known, Picked, Routes};
use crate::{ClientError, Operation};

/// One request: its inputs and how it runs.
pub struct Request<'a> {
    pub inputs: &'a HashMap<String, Tensor>,
    /// The sequence steps it is (a generation's step).
    pub sequence: Option<&'a Steps>,
    /// One per row: the next token is drawn on the worker that makes the
    /// logits.
    pub sampling: &'a [Sampling],
    /// Per-node times and every transfer, besides each subgraph's time.
    pub counters: bool,
    pub until: Instant,
    /// Only this copy (a sequence's, which holds its state).
    pub copy: Option<u32>,
}

/// What a request gave.
#[derive(Debug, Clone)]
pub struct Done {
    pub outputs: HashMap<String, Tensor>,
    /// A sampled step's next tokens, one per row.
    pub sampled: Vec<SampledToken>,
    pub counters: Counters,
    pub deployment: u64,
    pub attempts: u32,
}

/// How long a try's counters may lag its outputs (other workers' reports
/// come on their own streams).
const REPORTS_GRACE: Duration = Duration::from_millis(25);

/// Request ids: a random base per requester, mixed so that ids look
/// random (a worker refuses one that another identity holds).
pub struct Ids {
    base: u64,
    next: AtomicU64,
}

impl Ids {
    pub fn new() -> Ids {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(std::process::id().into());
        Ids {
            base: h.finish(),
            next: AtomicU64::new(1),
        }
    }

    /// A fresh id (never 0).
    pub fn next(&self) -> u64 {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // SplitMix64's finaliser: a bijection, so one requester's ids never
        // repeat.
        let mut z = self
            .base
            .wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)).max(1)
    }
}

impl Default for Ids {
    fn default() -> Ids {
        Ids::new()
    }
}

/// Runs `request` on the network `routes` serves: tries until it succeeds
/// or its rules say it fails.
pub async fn run(
    routes: &Routes,
    peers: &Peers,
    ids: &Ids,
    limits: &Limits,
    me: &str,
    request: Request<'_>,
) -> Result<Done, ClientError> {
    let table = routes
        .table()
        .ok_or_else(|| failed(ErrorKind::Unavailable, "no routing table"))?;
    if request.sequence.is_none_or(|s| s.fresh()) {
        table
            .signature
            .check(request.inputs)
            .map_err(|e| failed(ErrorKind::BadInput, &format!("bad inputs: {e}")))?;
    }
    // A request pinned to one copy (a sequence's step) has no other.
    let copies = match request.copy {
        Some(_) => 1,
        None => table.copies.len(),
    };
    let mut tries = Tries::new(request.sequence.is_some(), copies);
    loop {
        let (table, copy, deployment) = match routes
            .pick(tries.tried(), request.copy, request.until)
            .await
        {
            Picked::Ready {
                table,
                copy,
                deployment,
            } => (table, copy, deployment),
            Picked::Broken(why) => {
                return Err(failed(
                    ErrorKind::WorkerLost,
                    &format!("every copy is broken: {why}"),
                ))
            }
            Picked::Gone(why, kind) => return Err(failed(kind, &why)),
            Picked::TimedOut => return Err(verdict(tries.on_no_deployment(table.network))),
        };
        let id = ids.next();
        tries.start(id, deployment.id);
        let working = routes.start_work(deployment.id);
        let on = On {
            routes,
            copy,
            table: &table,
            deployment: &deployment,
        };
        let outcome = attempt(peers, limits, me, &on, id, &request).await;
        drop(working);
        let outcome = match outcome {
            Ok(mut done) => {
                done.attempts = tries.attempts();
                return Ok(done);
            }
            Err(outcome) => outcome,
        };
        let next = match tries.on_outcome(outcome) {
            Next::AwaitLoss => {
                let grace = Duration::from_millis(table.loss_grace_ms);
                let until = request.until.min(Instant::now() + grace);
                tries.on_settled(routes.settled(copy, deployment.id, until).await)
            }
            next => next,
        };
        match next {
            Next::Retry => tracing::info!(request = id, "retrying: {}", tries.last()),
            Next::Fail(v) => return Err(verdict(v)),
            Next::AwaitLoss => return Err(failed(ErrorKind::Internal, "waiting twice")),
        }
    }
}

fn failed(kind: ErrorKind, message: &str) -> ClientError {
    ClientError::Failed {
        op: Operation::Infer,
        kind,
        message: message.to_string(),
    }
}

fn verdict(v: Verdict) -> ClientError {
    match v {
        Verdict::Worker(e) => failed(ErrorKind::Worker, &e),
        Verdict::WorkerLost(e) => failed(ErrorKind::WorkerLost, &e),
        Verdict::Busy(e) => failed(ErrorKind::Busy, &e),
        Verdict::Deadline { request, waiting } => failed(
            ErrorKind::Timeout,
            &format!("request {request} missed its deadline{waiting}"),
        ),
        Verdict::Refused(e) => failed(ErrorKind::Refused, &e),
        Verdict::BadInput(e) => failed(ErrorKind::BadInput, &e),
    }
}

/// What a worker's stream brought.
enum Event {
    Output(String, Tensor, Transfer),
    Sampled(Vec<SampledToken>),
    Ran(u32, u64, Vec<tessera_common::wire::control::NodeTime>),
    Moved(Transfer),
    Failed(Outcome),
    Finished,
}

/// Where a try runs: copy `copy`'s `deployment`, as `table` has it (the
/// table followed on: a copy re-planned meanwhile fails the try).
struct On<'a> {
    routes: &'a Routes,
    copy: u32,
    table: &'a RoutingTable,
    deployment: &'a DeploymentRoute,
}

/// Waits until copy `copy` no longer runs deployment `deployment` ready
/// (a worker of it was lost: it heals, or broke); why.
async fn moved_away(
    watch: &mut tokio::sync::watch::Receiver<Known>,
    copy: u32,
    deployment: u64,
) -> String {
    loop {
        let gone = {
            let known = watch.borrow_and_update();
            let state = known.table.as_ref().and_then(|t| {
                t.copies.iter().find(|c| c.index == copy).map(|c| {
                    let id = c.deployment.as_ref().map(|d| d.id);
                    (c.state.clone(), id, c.retiring.contains(&deployment))
                })
            });
            match state {
                Some((CopyState::Ready, Some(id), _)) if id == deployment => None,
                // It moved off a draining worker: the old deployment
                // finishes what it holds.
                Some((CopyState::Ready, Some(_), true)) => None,
                Some((CopyState::Broken(why), _, _)) => Some(format!("copy {copy} broke: {why}")),
                Some(_) => Some(format!(
                    "copy {copy} was re-planned (a worker of it was lost)"
                )),
                None => known.gone.clone().or(Some(format!("copy {copy} is gone"))),
            }
        };
        if let Some(why) = gone {
            return why;
        }
        if watch.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// One try on `on.deployment`: every worker's stream at once.
async fn attempt(
    peers: &Peers,
    limits: &Limits,
    me: &str,
    on: &On<'_>,
    id: u64,
    request: &Request<'_>,
) -> Result<Done, Outcome> {
    let deployment = on.deployment;
    let mut watch = on.routes.watch();
    let sampled = !request.sampling.is_empty();
    let (given, computed) = wanted_outputs(on.table, deployment, request);
    let hosts: Vec<String> = deployment.hosts.iter().map(|h| h.name.clone()).collect();
    let all_given = computed.is_empty();
    let mut state = TryState::new(hosts, computed, 0);
    let (_streams, mut rx) = open_streams(peers, limits, me, deployment, id, request).await?;
    let mut outputs: Option<HashMap<String, Tensor>> = all_given.then(HashMap::new);
    let mut tokens: Option<Vec<SampledToken>> = (!sampled).then(Vec::new);
    let until = tokio::time::Instant::from_std(request.until);
    let mut grace: Option<tokio::time::Instant> = None;
    loop {
        if outputs.is_some() && tokens.is_some() && grace.is_none() {
            grace = Some(tokio::time::Instant::now() + REPORTS_GRACE);
        }
        let stop = grace.map_or(until, |g| g.min(until));
        let event = tokio::select! {
            event = tokio::time::timeout_at(stop, rx.recv()) => event,
            why = moved_away(&mut watch, on.copy, deployment.id), if grace.is_none() => {
                return Err(Outcome::Lost(why));
            }
        };
        let (host, event) = match event {
            Ok(Some(e)) => e,
            // Every stream ended, or the grace for late reports is over.
            Ok(None) | Err(_) if grace.is_some() => break,
            Ok(None) => {
                let missing = state.missing().join(", ");
                return Err(Outcome::Unreachable(format!(
                    "the workers' streams ended without {missing}"
                )));
            }
            Err(_) => {
                let missing = state.missing().join(", ");
                return Err(Outcome::Deadline(format!(" (still waiting for {missing})")));
            }
        };
        match event {
            Event::Output(name, tensor, transfer) => {
                if let Some(all) = state.on_output(name, tensor, transfer) {
                    outputs = Some(all);
                }
            }
            Event::Sampled(t) => tokens = Some(t),
            Event::Ran(subgraph, micros, nodes) => {
                state.on_ran(subgraph, micros, nodes);
            }
            Event::Moved(t) => state.on_moved(t),
            Event::Failed(outcome) => return Err(outcome),
            Event::Finished => {
                if state.on_host_finished(&host) && grace.is_some() {
                    break;
                }
            }
        }
    }
    let mut outputs = outputs.unwrap_or_default();
    for name in given {
        if let Some(t) = request.inputs.get(&name) {
            outputs.insert(name, t.clone());
        }
    }
    Ok(Done {
        outputs,
        sampled: tokens.unwrap_or_default(),
        counters: state.into_counters(),
        deployment: deployment.id,
        attempts: 1,
    })
}

/// The graph outputs a try waits for, split into those that are graph
/// inputs (given back as they came) and those the workers compute; a
/// sequence's state stays on the workers, and a sampled step gets tokens
/// instead of the logits.
fn wanted_outputs(
    table: &RoutingTable,
    deployment: &DeploymentRoute,
    request: &Request<'_>,
) -> (Vec<String>, Vec<String>) {
    let stateful = request.sequence.is_some();
    let sampled = !request.sampling.is_empty();
    table
        .signature
        .outputs
        .iter()
        .map(|o| o.name.clone())
        .filter(|n| !(stateful && deployment.state_outputs.contains(n)))
        .filter(|n| !(sampled && n == LOGITS))
        .partition(|n| request.inputs.contains_key(n))
}

/// A stream to each of `deployment`'s workers carrying request `id`, and
/// the events they bring (the set ends the streams when dropped).
async fn open_streams(
    peers: &Peers,
    limits: &Limits,
    me: &str,
    deployment: &DeploymentRoute,
    id: u64,
    request: &Request<'_>,
) -> Result<
    (
        tokio::task::JoinSet<()>,
        mpsc::UnboundedReceiver<(String, Event)>,
    ),
    Outcome,
> {
    let (tx, rx) = mpsc::unbounded_channel::<(String, Event)>();
    let mut streams = tokio::task::JoinSet::new();
    for host in &deployment.hosts {
        let open = Open {
            deployment: deployment.id,
            request: id,
            inputs: 0,
            counters: request.counters,
            sequence: request.sequence.cloned(),
            sampling: request.sampling.to_vec(),
        };
        let tensors = tensors_for(deployment, &host.name, request);
        let worker = peers
            .worker(&host.name, &host.data_addr)
            .await
            .map_err(|e| Outcome::Unreachable(e.to_string()))?;
        let (tx, limits, me) = (tx.clone(), *limits, me.to_string());
        streams.spawn(async move { one_worker(worker, open, tensors, limits, me, tx).await });
    }
    Ok((streams, rx))
}

/// The output a generative network's last stage makes; a sampled step gets
/// its tokens instead.
pub const LOGITS: &str = "logits";

/// The tensors `host` reads of a request: its graph inputs and triggers.
fn tensors_for(
    deployment: &DeploymentRoute,
    host: &str,
    request: &Request<'_>,
) -> Vec<(String, Tensor)> {
    let mut tensors: Vec<(String, Tensor)> = deployment
        .inputs
        .iter()
        .filter(|(_, readers)| readers.iter().any(|r| r == host))
        .filter_map(|(name, _)| request.inputs.get(name).map(|t| (name.clone(), t.clone())))
        .collect();
    let later_step = request.sequence.is_some_and(|s| !s.fresh());
    let triggered = deployment.triggers.iter().any(|h| h == host)
        || (later_step && deployment.state_triggers.iter().any(|h| h == host));
    if triggered {
        if let Ok(trigger) = Tensor::new(ElemType::UINT8, vec![0], Vec::new()) {
            tensors.push((TRIGGER.to_string(), trigger));
        }
    }
    tensors
}

/// One worker's stream of a try: the `Open` and its tensors out, then
/// every reply in as events (ending with `Finished`).
async fn one_worker(
    worker: crate::peers::Worker,
    mut open: Open,
    tensors: Vec<(String, Tensor)>,
    limits: Limits,
    me: String,
    events: mpsc::UnboundedSender<(String, Event)>,
) {
    let host = worker.name.to_string();
    let send_event = |e: Event| events.send((host.clone(), e)).is_ok();
    let _slot = match worker.slot().await {
        Ok(slot) => slot,
        Err(e) => {
            send_event(Event::Failed(Outcome::Unreachable(e.to_string())));
            return;
        }
    };
    open.inputs = tensors.len() as u32;
    let unreachable =
        |e: String| Event::Failed(Outcome::Unreachable(format!("worker {host}: {e}")));
    let (mut send, mut recv) = match exchange::open(&worker.connection).await {
        Ok(s) => s,
        Err(e) => {
            send_event(unreachable(e.to_string()));
            return;
        }
    };
    let shared = tessera_net::shared::of(&worker.connection);
    let sent = send_open(&mut send, shared.as_deref(), &open, &tensors, &limits);
    if let Err(e) = sent.await {
        send_event(unreachable(e));
        return;
    }
    loop {
        let frame =
            match recv_frame_shared::<DataReply>(shared.as_deref(), &mut recv, &limits).await {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    send_event(Event::Finished);
                    return;
                }
                Err(e) => {
                    send_event(unreachable(e.to_string()));
                    return;
                }
            };
        let event = match frame {
            (Frame::Tensor(header, payload), took) => {
                let head = header.encode(&limits).map_or(0, |h| h.len());
                count(&worker, head + payload.len());
                output(header, payload, took, &host, &me)
            }
            (Frame::Control(reply, _), _) => {
                count(&worker, reply.encode(0, &limits).map_or(0, |h| h.len()));
                reply_event(reply, &host)
            }
            (Frame::Handshake(_), _) => Event::Failed(Outcome::Error(format!(
                "worker {host}: a handshake frame on a request's stream"
            ))),
        };
        let last = matches!(event, Event::Failed(_));
        if !send_event(event) || last {
            return;
        }
    }
}

/// Counts `bytes` of a frame received from a worker.
fn count(worker: &crate::peers::Worker, bytes: usize) {
    worker
        .received
        .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
}

async fn send_open(
    send: &mut quinn::SendStream,
    shared: Option<&tessera_net::shared::Shared>,
    open: &Open,
    tensors: &[(String, Tensor)],
    limits: &Limits,
) -> Result<(), String> {
    let msg = DataRequest::Open(open.clone());
    exchange::send_message(send, &msg, None, limits)
        .await
        .map_err(|e| e.to_string())?;
    for (name, t) in tensors {
        let head = TensorHeader::new(open.deployment, open.request, name, t)
            .in_sequence(open.sequence.clone())
            .encode(limits)
            .map_err(|e| e.to_string())?;
        send_frame_shared(shared, send, &head, Some(&t.shared_bytes()))
            .await
            .map_err(|e| e.to_string())?;
    }
    let _ = send.finish();
    Ok(())
}

fn output(
    header: TensorHeader,
    payload: bytes::Bytes,
    took: Duration,
    host: &str,
    me: &str,
) -> Event {
    let name = header.name.clone();
    let transfer = Transfer {
        request: header.request,
        tensor: name.clone(),
        from: host.to_string(),
        to: me.to_string(),
        bytes: payload.len() as u64,
        micros: took.as_micros() as u64,
    };
    match header.into_tensor(payload) {
        Ok(t) => Event::Output(name, t, transfer),
        Err(e) => Event::Failed(Outcome::Error(format!("worker {host}: output {name}: {e}"))),
    }
}

fn reply_event(reply: DataReply, host: &str) -> Event {
    match reply {
        DataReply::Ran {
            subgraph,
            micros,
            nodes,
        } => Event::Ran(subgraph, micros, nodes),
        DataReply::Moved(t) => Event::Moved(t),
        DataReply::Sampled(tokens) => Event::Sampled(tokens),
        DataReply::Unreachable { error } => Event::Failed(Outcome::Unreachable(error)),
        DataReply::Busy { reason, .. } => Event::Failed(Outcome::Busy(reason)),
        DataReply::Failed(Failure { kind, error, .. }) => Event::Failed(match kind {
            ErrorKind::Busy => Outcome::Busy(error),
            // The deployment left the worker (re-planned): learn the new one.
            ErrorKind::Unavailable => Outcome::Unreachable(format!("worker {host}: {error}")),
            ErrorKind::BadInput => Outcome::BadInput(error),
            ErrorKind::Refused => Outcome::Refused(error),
            _ => Outcome::Error(format!("worker {host}: {error}")),
        }),
        DataReply::Done => Event::Failed(Outcome::Error(format!(
            "worker {host}: {} on a request's stream",
            reply.name()
        ))),
    }
}
