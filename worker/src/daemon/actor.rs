//! One actix actor per deployed subgraph. Its bounded mailbox receives the
//! subgraph's input tensors as they arrive, from any peer; a request runs
//! as soon as all of its inputs are there, one at a time per subgraph (a
//! pipeline stage), on the subgraph's own compute thread so the actor
//! keeps receiving. The compute thread hands each request's outputs to the
//! [`Router`], which streams them to their consumers, the moment they are
//! computed (no hop back through the actor first).
//!
//! The thread is the subgraph's for its whole life: the backend's
//! per-thread state (scratch buffers, caches) stays warm from one request
//! to the next, which a shared blocking pool does not guarantee.
//!
//! A subgraph that reads or makes state (a state pair's input or output)
//! takes and keeps each sequence's state in its network's store on this
//! worker (`super::sequences`), on its compute thread: a step of a
//! sequence brings only its other inputs, and its state outputs stay here.
//! A fresh sequence beyond the store's room waits in the actor's
//! `Admission` queue, or is refused as busy.
//!
//! With dynamic batching on, the requests ready meanwhile (up to
//! `max_batch`, of matching shapes) go to the thread as one job,
//! concatenated along the first dimension and split back after the run
//! (`super::batch`). A batch queues behind the running one only when it
//! is full; a smaller one waits to grow until the thread is free, and then
//! up to `max_queue_delay_us` after its oldest request became ready.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use actix::WeakAddr;
use tessera_common::tensor::Tensor;
use tessera_common::wire::control::{Batching, ErrorKind, NodeTime};
use tessera_common::wire::generate::Steps;

use super::admission::{Admission, Offer};
use super::batch::{self, Ready};
use super::routes::Router;
use super::sequences::{SequenceStore, StateSlots};
use super::telemetry::SubgraphGauge;
use crate::plugin::{CompiledSubgraph, ExecStatus, InferResult};

/// Requests handed to the compute thread at once: the one it runs and the
/// next, so it starts the next without waiting on the actor.
const HANDED: usize = 2;

/// An input tensor of a request (or its trigger, [`tessera_common::wire::tensor::TRIGGER`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Arrived {
    pub request: u64,
    pub sequence: Option<Steps>,
    pub name: Arc<str>,
    pub tensor: Tensor,
}

/// A sequence of the network ended here: a fresh one waiting for room may
/// start.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Admit;

/// Forget a request (it failed elsewhere or timed out).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Forget {
    pub request: u64,
}

/// Stop after the request running now; answers the compute thread, which
/// ends once that request is done (joining it waits for the subgraph's
/// backend session to be dropped on the thread that used it).
#[derive(Message)]
#[rtype(result = "Option<std::thread::JoinHandle<()>>")]
pub struct Stop;

/// Stops `actors` and waits until each one's compute thread has ended
/// (the request it runs finished, its compiled subgraph dropped there).
pub async fn stop_all(actors: Vec<Addr<SubgraphActor>>) {
    let threads = futures_util::future::join_all(actors.iter().map(|a| a.send(Stop))).await;
    for thread in threads.into_iter().flat_map(|t| t.ok().flatten()) {
        let name = thread.thread().name().unwrap_or("sg").to_string();
        match tokio::task::spawn_blocking(move || thread.join()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => tracing::warn!(thread = %name, "a compute thread panicked"),
            Err(e) => tracing::warn!(thread = %name, "cannot join a compute thread: {e}"),
        }
    }
}

/// The compute thread finished (or skipped) a job.
#[derive(Message)]
#[rtype(result = "()")]
struct Finished {
    requests: Vec<u64>,
}

/// Requests for the compute thread: one, or a batch.
struct Job {
    requests: Vec<u64>,
    /// The sequence step of each request (a batch has none).
    sequences: Vec<Option<Steps>>,
    inputs: Vec<Vec<Tensor>>,
}

/// A request still waiting for inputs.
struct Pending {
    inputs: Vec<Option<Tensor>>,
    since: Instant,
    sequence: Option<Steps>,
}

pub struct SubgraphActor {
    pub network: u64,
    pub subgraph: u32,
    /// `node/DEVICE`, for errors.
    pub device: String,
    /// Handed to the compute thread when it starts: the thread is then its
    /// only owner, so the backend's session is dropped there.
    compiled: Option<Arc<dyn CompiledSubgraph>>,
    /// The compute thread, until [`Stop`] hands it to whoever joins it.
    thread: Option<std::thread::JoinHandle<()>>,
    /// Input names in the compiled subgraph's order.
    pub inputs: Vec<Arc<str>>,
    pub outputs: Vec<Arc<str>>,
    pub router: Arc<Router>,
    pub mailbox: usize,
    /// Requests whose inputs stay incomplete this long are dropped.
    pub stale_after: Duration,
    /// Dynamic batching (`None`: one request at a time).
    pub batching: Option<Batching>,
    /// The state it reads and makes (none: stateless).
    pub state: StateSlots,
    /// A sequence's state idle this long is dropped.
    pub sequence_idle: Duration,
    /// Its network's kept state on this worker, shared with the other
    /// subgraphs of the network here; read and written on the compute
    /// thread, for each step in its order.
    pub store: Arc<Mutex<SequenceStore>>,
    pending: HashMap<u64, Pending>,
    ready: VecDeque<Ready>,
    /// Jobs handed to the compute thread, not finished yet.
    handed: VecDeque<Vec<u64>>,
    /// A batch is waiting for more requests until a timer fires.
    waiting_for_batch: bool,
    /// The compute thread's queue (`None` if it could not start).
    jobs: Option<mpsc::SyncSender<Job>>,
    /// Handed requests forgotten since: the thread skips them.
    cancelled: Arc<Mutex<HashSet<u64>>>,
    /// Fresh sequences waiting for room in the store.
    pub admission: Admission,
    /// Its load, as heartbeats report it.
    gauge: Arc<SubgraphGauge>,
}

impl SubgraphActor {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        network: u64,
        subgraph: u32,
        device: String,
        compiled: Arc<dyn CompiledSubgraph>,
        inputs: Vec<Arc<str>>,
        outputs: Vec<Arc<str>>,
        router: Arc<Router>,
        mailbox: usize,
    ) -> SubgraphActor {
        SubgraphActor {
            network,
            subgraph,
            device,
            compiled: Some(compiled),
            thread: None,
            inputs,
            outputs,
            mailbox,
            stale_after: Duration::from_secs(300),
            batching: None,
            state: StateSlots::default(),
            sequence_idle: Duration::from_secs(600),
            store: Arc::new(Mutex::new(SequenceStore::new(0))),
            pending: HashMap::new(),
            ready: VecDeque::new(),
            handed: VecDeque::new(),
            waiting_for_batch: false,
            jobs: None,
            cancelled: Default::default(),
            admission: Admission::new(0, Duration::ZERO),
            gauge: router.telemetry.gauge(network, subgraph),
            router,
        }
    }

    /// Publishes how many requests this actor holds.
    fn publish_depth(&self) {
        let handed: usize = self.handed.iter().map(Vec::len).sum();
        let held = self.pending.len() + self.ready.len() + handed + self.admission.len();
        self.gauge
            .depth
            .store(held as u32, std::sync::atomic::Ordering::Relaxed);
    }

    /// Hands ready requests to the compute thread while it has room: one
    /// at a time, or with batching a batch at a time. A batch queued behind
    /// a running one goes only when it is full (a smaller one waits to grow
    /// until the thread is free).
    fn next(&mut self, ctx: &mut Context<Self>) {
        while self.handed.len() < HANDED {
            let busy = !self.handed.is_empty();
            let take = match batch::gate(&self.ready, self.batching, busy, Instant::now()) {
                batch::Gate::Run(n) => n,
                batch::Gate::HoldFor(left) => {
                    self.wake_after(left, ctx);
                    return;
                }
                batch::Gate::Wait => return,
            };
            let taken: Vec<Ready> = self.ready.drain(..take).collect();
            let requests: Vec<u64> = taken.iter().map(|r| r.request).collect();
            let sequences = taken.iter().map(|r| r.sequence.clone()).collect();
            let inputs = taken.into_iter().map(|r| r.inputs).collect();
            let job = Job {
                requests: requests.clone(),
                sequences,
                inputs,
            };
            let handed = self
                .jobs
                .as_ref()
                .is_some_and(|jobs| jobs.try_send(job).is_ok());
            if handed {
                self.handed.push_back(requests);
            } else {
                let error = format!(
                    "subgraph {} on {}: its compute thread is not running",
                    self.subgraph, self.device
                );
                for request in requests {
                    self.router.fail(request, error.clone());
                }
            }
        }
    }

    /// Calls [`Self::next`] again in `left` (once: a timer already set
    /// stands).
    fn wake_after(&mut self, left: Duration, ctx: &mut Context<Self>) {
        if !self.waiting_for_batch {
            self.waiting_for_batch = true;
            ctx.run_later(left, |actor, ctx| {
                actor.waiting_for_batch = false;
                actor.next(ctx);
                actor.publish_depth();
            });
        }
    }

    /// A request whose inputs have all arrived.
    fn make_ready(
        &mut self,
        request: u64,
        sequence: Option<Steps>,
        inputs: Vec<Tensor>,
        ctx: &mut Context<Self>,
    ) {
        let ready = Ready {
            request,
            sequence,
            inputs,
            since: Instant::now(),
        };
        let starts = ready.sequence.as_ref().filter(|s| s.fresh());
        match starts.and_then(Steps::first_id) {
            Some(sequence) if !self.state.is_empty() => self.admit(ready, sequence, ctx),
            _ => self.ready.push_back(ready),
        }
        self.next(ctx);
    }

    /// A fresh step: it runs if the store has room for its sequence, else
    /// it waits for room (until its timeout) or is refused as busy.
    fn admit(&mut self, ready: Ready, sequence: u64, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        match self.admission.offer(ready, sequence, &mut store, now) {
            Offer::Run(ready) => self.ready.push_back(ready),
            Offer::Queued => {
                tracing::debug!(sequence, waiting = self.admission.len(), "waiting for room");
                ctx.run_later(self.admission.timeout(), |actor, ctx| {
                    actor.admit_waiting(ctx)
                });
            }
            Offer::Busy(ready, why) => {
                let (router, request) = (self.router.clone(), ready.request);
                router.fail_as(request, ErrorKind::Busy, why);
            }
        }
    }

    /// Runs the waiting fresh steps that now have room; refuses those that
    /// waited too long.
    fn admit_waiting(&mut self, ctx: &mut Context<Self>) {
        let (run, expired) = {
            let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
            self.admission.admit(&mut store, Instant::now())
        };
        self.ready.extend(run);
        for ready in expired {
            let why = format!(
                "no room for a new sequence within {:?} (max_sequences {})",
                self.admission.timeout(),
                self.store.lock().map_or(0, |s| s.max_sequences())
            );
            self.router.fail_as(ready.request, ErrorKind::Busy, why);
        }
        self.next(ctx);
        self.publish_depth();
    }

    /// Starts the compute thread, its compiled subgraph's only owner; it
    /// reports back to `actor`.
    fn spawn_thread(
        &mut self,
        actor: WeakAddr<SubgraphActor>,
    ) -> std::io::Result<mpsc::SyncSender<Job>> {
        let compiled = self
            .compiled
            .take()
            .ok_or_else(|| std::io::Error::other("its compute thread was started already"))?;
        let (tx, rx) = mpsc::sync_channel::<Job>(HANDED);
        let thread = ComputeThread {
            network: self.network,
            subgraph: self.subgraph,
            device: self.device.clone(),
            compiled,
            outputs: self.outputs.clone(),
            router: self.router.clone(),
            runtime: tokio::runtime::Handle::current(),
            cancelled: self.cancelled.clone(),
            actor,
            constants: None,
            takes_inputs: !self.inputs.is_empty(),
            store: self.store.clone(),
            state: self.state.clone(),
            gauge: self.gauge.clone(),
        };
        let handle = std::thread::Builder::new()
            .name(format!("sg-{}-{}", self.network, self.subgraph))
            .spawn(move || thread.run(rx))?;
        self.thread = Some(handle);
        Ok(tx)
    }
}

/// A request and the sequence step it is, if any.
type Tagged = (u64, Option<Steps>);

/// What the compute thread owns.
struct ComputeThread {
    network: u64,
    subgraph: u32,
    device: String,
    compiled: Arc<dyn CompiledSubgraph>,
    outputs: Vec<Arc<str>>,
    router: Arc<Router>,
    runtime: tokio::runtime::Handle,
    cancelled: Arc<Mutex<HashSet<u64>>>,
    actor: WeakAddr<SubgraphActor>,
    /// Outputs of a subgraph without inputs (constants only), computed on
    /// its first trigger and reused.
    constants: Option<Vec<Tensor>>,
    takes_inputs: bool,
    store: Arc<Mutex<SequenceStore>>,
    state: StateSlots,
    gauge: Arc<SubgraphGauge>,
}

impl ComputeThread {
    /// Runs jobs until the actor drops its end of the queue.
    fn run(mut self, jobs: mpsc::Receiver<Job>) {
        while let Ok(Job {
            requests,
            sequences,
            inputs,
        }) = jobs.recv()
        {
            if self.actor.upgrade().is_none() {
                return; // stopped
            }
            // A request forgotten while it waited here is skipped (one
            // forgotten while it runs: its outputs are dropped where they
            // land, and the actor clears its mark when it finishes).
            let (live, inputs): (Vec<Tagged>, Vec<Vec<Tensor>>) = {
                let mut cancelled = self.cancelled.lock().unwrap_or_else(|p| p.into_inner());
                requests
                    .iter()
                    .copied()
                    .zip(sequences)
                    .zip(inputs)
                    .filter(|((r, _), _)| !cancelled.remove(r))
                    .unzip()
            };
            match live.len() {
                0 => {}
                1 => {
                    let (request, sequence) = live.into_iter().next().unwrap_or_default();
                    let inputs = inputs.into_iter().next().unwrap_or_default();
                    self.compute(request, sequence, inputs);
                }
                _ => {
                    let live: Vec<u64> = live.iter().map(|(r, _)| *r).collect();
                    self.compute_batch(&live, inputs)
                }
            }
            match self.actor.upgrade() {
                Some(actor) => actor.do_send(Finished { requests }),
                None => return,
            }
        }
    }

    /// Runs the subgraph on `inputs` (or gives its constants).
    fn infer(&mut self, inputs: &[Tensor]) -> (Result<InferResult, RunError>, Duration) {
        self.router.telemetry.running(true);
        let started = Instant::now();
        let result = match &self.constants {
            Some(outputs) => Ok(InferResult {
                outputs: outputs.clone(),
                counters: Vec::new(),
            }),
            None => {
                let compiled = &self.compiled;
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compiled.infer(inputs)))
                    .map_err(|_| RunError::Panicked)
                    .and_then(|r| r.map_err(RunError::Backend))
            }
        };
        let elapsed = started.elapsed();
        self.router.telemetry.running(false);
        use std::sync::atomic::Ordering::Relaxed;
        self.gauge.runs.fetch_add(1, Relaxed);
        self.gauge
            .busy_us
            .fetch_add(elapsed.as_micros() as u64, Relaxed);
        if result.is_err() {
            self.gauge.failed.fetch_add(1, Relaxed);
        }
        tracing::debug!(
            micros = elapsed.as_micros() as u64,
            ok = result.is_ok(),
            "ran"
        );
        (result, elapsed)
    }

    /// Runs a request (a step of `sequence`, if given) and streams its
    /// outputs on. A step of a subgraph that reads or makes state takes its
    /// state inputs from the store and keeps its state outputs there (they
    /// still go to their readers, never back to the requester).
    fn compute(&mut self, request: u64, sequence: Option<Steps>, given: Vec<Tensor>) {
        let span = tracing::debug_span!(
            "subgraph_run",
            request,
            network = self.network,
            subgraph = self.subgraph,
            device = %self.device,
            sequence = sequence.as_ref().and_then(Steps::first_id),
            rows = sequence.as_ref().map(|s| s.rows.len())
        );
        let _entered = span.enter();
        let stateful = sequence.as_ref().filter(|_| !self.state.is_empty());
        let inputs = match stateful {
            Some(steps) => {
                let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
                match store.inputs(steps, &self.state, given) {
                    Ok(inputs) => inputs,
                    Err(e) => return self.fail(request, e),
                }
            }
            None => given,
        };
        let (result, elapsed) = self.infer(&inputs);
        let result = match stateful {
            Some(steps) => self.keep_state(steps, result),
            None => result,
        };
        match result {
            Ok(result) => {
                if !self.takes_inputs && self.constants.is_none() {
                    self.constants = Some(result.outputs.clone());
                }
                let nodes = result
                    .counters
                    .into_iter()
                    .filter(|c| c.status == ExecStatus::Executed)
                    .map(|c| NodeTime {
                        node: c.node,
                        micros: c.real_us,
                    })
                    .collect();
                self.deliver(request, sequence, result.outputs, elapsed, nodes);
            }
            Err(e) => self.fail(request, e),
        }
    }

    /// Keeps each row's state outputs for its next step; a failed step
    /// (or one whose state cannot be kept) leaves no usable state behind.
    fn keep_state(
        &self,
        steps: &Steps,
        result: Result<InferResult, RunError>,
    ) -> Result<InferResult, RunError> {
        let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
        let kept = match result {
            Ok(r) if self.state.writes.is_empty() => Ok(r),
            Ok(r) => match store.keep(steps, &self.state, &r.outputs) {
                Ok(()) => Ok(r),
                Err(e) => Err(RunError::Sequence(e)),
            },
            Err(e) => Err(e),
        };
        match &kept {
            Ok(_) => tracing::debug!(
                sequences = store.len(),
                state_bytes = store.bytes(),
                "state kept"
            ),
            Err(_) => {
                for row in &steps.rows {
                    store.end(row.id);
                }
            }
        }
        kept
    }

    /// Runs `requests` as one batch and answers each with its own rows; a
    /// batch that cannot be joined or split runs request by request.
    fn compute_batch(&mut self, requests: &[u64], inputs: Vec<Vec<Tensor>>) {
        let span = tracing::debug_span!(
            "subgraph_run",
            request = requests[0],
            batch = requests.len(),
            network = self.network,
            subgraph = self.subgraph,
            device = %self.device
        );
        let entered = span.enter();
        let (joined, rows) = match batch::concat(&inputs) {
            Ok(joined) => joined,
            Err(e) => {
                tracing::warn!("not batched: {e}");
                drop(entered);
                for (&r, inputs) in requests.iter().zip(inputs) {
                    self.compute(r, None, inputs);
                }
                return;
            }
        };
        let (result, elapsed) = self.infer(&joined);
        match result.map(|r| batch::split(r.outputs, &rows)) {
            Ok(Ok(per_request)) => {
                for (&r, outputs) in requests.iter().zip(per_request) {
                    self.deliver(r, None, outputs, elapsed, Vec::new());
                }
            }
            Ok(Err(e)) => {
                tracing::warn!("batch not split, running its requests one by one: {e}");
                drop(entered);
                for (&r, inputs) in requests.iter().zip(inputs) {
                    self.compute(r, None, inputs);
                }
            }
            Err(e) => {
                for &r in requests {
                    self.fail(r, &e);
                }
            }
        }
    }

    /// Streams a request's outputs to their consumers.
    fn deliver(
        &self,
        request: u64,
        sequence: Option<Steps>,
        outputs: Vec<Tensor>,
        took: Duration,
        nodes: Vec<NodeTime>,
    ) {
        let outputs: Vec<(Arc<str>, Tensor)> = self.outputs.iter().cloned().zip(outputs).collect();
        let (router, network, subgraph) = (self.router.clone(), self.network, self.subgraph);
        let ran = super::routes::Ran {
            network,
            subgraph,
            request,
            sequence,
        };
        self.runtime
            .spawn(async move { router.deliver(ran, outputs, took, nodes).await });
    }

    fn fail(&self, request: u64, error: impl std::fmt::Display) {
        let error = format!("subgraph {} on {}: {error}", self.subgraph, self.device);
        self.router.fail(request, error);
    }
}

/// Why a run of a subgraph failed.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("the backend panicked")]
    Panicked,
    #[error(transparent)]
    Backend(crate::plugin::PluginError),
    #[error(transparent)]
    Sequence(#[from] super::sequences::SequenceError),
}

impl Actor for SubgraphActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox);
        match self.spawn_thread(ctx.address().downgrade()) {
            Ok(jobs) => self.jobs = Some(jobs),
            Err(e) => tracing::error!(
                subgraph = self.subgraph,
                "cannot start the subgraph's compute thread: {e}"
            ),
        }
        let every = (self.stale_after / 4).max(Duration::from_secs(1));
        ctx.run_interval(every, |actor, _| {
            let (stale, now) = (actor.stale_after, Instant::now());
            actor.pending.retain(|request, p| {
                let keep = now.saturating_duration_since(p.since) < stale;
                if !keep {
                    tracing::warn!(request, "dropping a request whose inputs never all arrived");
                }
                keep
            });
            if !actor.state.is_empty() {
                let idle = actor.sequence_idle;
                let mut store = actor.store.lock().unwrap_or_else(|p| p.into_inner());
                let dropped = store.sweep(idle, now);
                if dropped > 0 {
                    tracing::info!(dropped, "dropped the state of idle sequences");
                }
            }
        });
    }
}

impl Handler<Arrived> for SubgraphActor {
    type Result = ();

    fn handle(&mut self, msg: Arrived, ctx: &mut Self::Context) {
        if self.inputs.is_empty() {
            // A subgraph of constants only: its trigger arrived.
            self.make_ready(msg.request, None, Vec::new(), ctx);
            self.publish_depth();
            return;
        }
        // A later step of a sequence takes its state from the store.
        let from_store = |s: &Option<Steps>| s.as_ref().is_some_and(|s| !s.fresh());
        if msg.name.is_empty() {
            // The trigger of a later step, for a subgraph that reads only
            // state (nothing else of the step comes to it).
            let n = self.inputs.len();
            if from_store(&msg.sequence) && (0..n).all(|i| self.state.is_state_input(i)) {
                self.make_ready(msg.request, msg.sequence, Vec::new(), ctx);
                self.publish_depth();
            }
            return;
        }
        let Some(slot) = self.inputs.iter().position(|n| *n == msg.name) else {
            return;
        };
        if from_store(&msg.sequence) && self.state.is_state_input(slot) {
            return;
        }
        let n = self.inputs.len();
        let p = self.pending.entry(msg.request).or_insert_with(|| Pending {
            inputs: vec![None; n],
            since: Instant::now(),
            sequence: msg.sequence,
        });
        p.inputs[slot] = Some(msg.tensor);
        let stored = from_store(&p.sequence);
        let complete = p
            .inputs
            .iter()
            .enumerate()
            .all(|(i, t)| t.is_some() || (stored && self.state.is_state_input(i)));
        if complete {
            if let Some(p) = self.pending.remove(&msg.request) {
                let inputs = p.inputs.into_iter().flatten().collect();
                self.make_ready(msg.request, p.sequence, inputs, ctx);
            }
        }
        self.publish_depth();
    }
}

impl Handler<Finished> for SubgraphActor {
    type Result = ();

    fn handle(&mut self, msg: Finished, ctx: &mut Self::Context) {
        if let Some(at) = self.handed.iter().position(|job| *job == msg.requests) {
            self.handed.remove(at);
            if let Ok(mut cancelled) = self.cancelled.lock() {
                for r in &msg.requests {
                    cancelled.remove(r);
                }
            }
        }
        self.next(ctx);
        self.publish_depth();
    }
}

impl Handler<Admit> for SubgraphActor {
    type Result = ();

    fn handle(&mut self, _: Admit, ctx: &mut Self::Context) {
        if !self.admission.is_empty() {
            self.admit_waiting(ctx);
        }
    }
}

impl Handler<Forget> for SubgraphActor {
    type Result = ();

    fn handle(&mut self, msg: Forget, _: &mut Self::Context) {
        self.pending.remove(&msg.request);
        self.ready.retain(|r| r.request != msg.request);
        if !self.admission.is_empty() {
            let mut store = self.store.lock().unwrap_or_else(|p| p.into_inner());
            self.admission.forget(msg.request, &mut store);
        }
        if self.handed.iter().any(|job| job.contains(&msg.request)) {
            if let Ok(mut cancelled) = self.cancelled.lock() {
                cancelled.insert(msg.request);
            }
        }
        self.publish_depth();
    }
}

impl Handler<Stop> for SubgraphActor {
    type Result = Option<std::thread::JoinHandle<()>>;

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) -> Self::Result {
        // Jobs already handed are skipped; with its queue closed the
        // compute thread ends after the one it runs.
        if let Ok(mut cancelled) = self.cancelled.lock() {
            cancelled.extend(self.handed.iter().flatten());
        }
        self.jobs = None;
        ctx.stop();
        self.thread.take()
    }
}
