//! One actix actor per deployed subgraph. Its bounded mailbox receives the
//! subgraph's input tensors as they arrive, from any peer; a request runs
//! as soon as all of its inputs are there, one at a time per subgraph (a
//! pipeline stage), on tokio's blocking pool so the actor keeps receiving.
//! Outputs go to the [`Router`], which streams them to their consumers.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tessera_common::tensor::Tensor;

use super::routes::Router;
use tessera_common::wire::control::NodeTime;

use crate::plugin::{CompiledSubgraph, ExecStatus};

/// The tensor name that triggers subgraphs without inputs.
pub const TRIGGER: &str = "";

/// An input tensor of a request (or its [`TRIGGER`]).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Arrived {
    pub request: u64,
    pub name: Arc<str>,
    pub tensor: Tensor,
}

/// Forget a request (it failed elsewhere or timed out).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Forget {
    pub request: u64,
}

/// Stop after the request running now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

pub struct SubgraphActor {
    pub network: u64,
    pub subgraph: u32,
    /// `node/DEVICE`, for errors.
    pub device: String,
    pub compiled: Arc<dyn CompiledSubgraph>,
    /// Input names in the compiled subgraph's order.
    pub inputs: Vec<Arc<str>>,
    pub outputs: Vec<Arc<str>>,
    pub router: Arc<Router>,
    pub mailbox: usize,
    /// Requests whose inputs stay incomplete this long are dropped.
    pub stale_after: Duration,
    pending: HashMap<u64, (Vec<Option<Tensor>>, Instant)>,
    ready: VecDeque<(u64, Vec<Tensor>)>,
    running: bool,
    /// Outputs of a subgraph without inputs (constants only), computed on
    /// its first trigger and reused.
    constants: Option<Vec<Tensor>>,
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
            compiled,
            inputs,
            outputs,
            router,
            mailbox,
            stale_after: Duration::from_secs(300),
            pending: HashMap::new(),
            ready: VecDeque::new(),
            running: false,
            constants: None,
        }
    }

    /// Starts the next ready request if none runs.
    fn next(&mut self, ctx: &mut Context<Self>) {
        if self.running {
            return;
        }
        let Some((request, inputs)) = self.ready.pop_front() else {
            return;
        };
        self.running = true;
        self.router.running(true);
        let compiled = self.compiled.clone();
        let constants = self.constants.clone();
        let started = Instant::now();
        let run = async move {
            if let Some(outputs) = constants {
                return Ok(crate::plugin::InferResult {
                    outputs,
                    counters: Vec::new(),
                });
            }
            tokio::task::spawn_blocking(move || compiled.infer(&inputs))
                .await
                .map_err(|e| format!("the subgraph's thread failed: {e}"))
                .and_then(|r| r.map_err(|e| e.to_string()))
        };
        ctx.spawn(run.into_actor(self).map(move |result, actor, ctx| {
            actor.running = false;
            actor.router.running(false);
            let router = actor.router.clone();
            let (network, subgraph) = (actor.network, actor.subgraph);
            match result {
                Ok(result) => {
                    if actor.inputs.is_empty() && actor.constants.is_none() {
                        actor.constants = Some(result.outputs.clone());
                    }
                    let outputs: Vec<(Arc<str>, Tensor)> =
                        actor.outputs.iter().cloned().zip(result.outputs).collect();
                    let elapsed = started.elapsed();
                    let nodes = result
                        .counters
                        .into_iter()
                        .filter(|c| c.status == ExecStatus::Executed)
                        .map(|c| NodeTime {
                            node: c.node,
                            micros: c.real_us,
                        })
                        .collect();
                    tokio::spawn(async move {
                        router
                            .deliver(network, subgraph, request, outputs, elapsed, nodes)
                            .await
                    });
                }
                Err(e) => {
                    let error = format!("subgraph {subgraph} on {}: {e}", actor.device);
                    tokio::spawn(async move { router.fail(request, error).await });
                }
            }
            actor.next(ctx);
        }));
    }
}

impl Actor for SubgraphActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox);
        let every = (self.stale_after / 4).max(Duration::from_secs(1));
        ctx.run_interval(every, |actor, _| {
            let stale = actor.stale_after;
            actor.pending.retain(|request, (_, since)| {
                let keep = since.elapsed() < stale;
                if !keep {
                    tracing::warn!(request, "dropping a request whose inputs never all arrived");
                }
                keep
            });
        });
    }
}

impl Handler<Arrived> for SubgraphActor {
    type Result = ();

    fn handle(&mut self, msg: Arrived, ctx: &mut Self::Context) {
        if self.inputs.is_empty() {
            // A subgraph of constants only: its trigger arrived.
            self.ready.push_back((msg.request, Vec::new()));
            self.next(ctx);
            return;
        }
        let Some(slot) = self.inputs.iter().position(|n| *n == msg.name) else {
            return;
        };
        let n = self.inputs.len();
        let (got, _) = self
            .pending
            .entry(msg.request)
            .or_insert_with(|| (vec![None; n], Instant::now()));
        got[slot] = Some(msg.tensor);
        if got.iter().all(Option::is_some) {
            if let Some((got, _)) = self.pending.remove(&msg.request) {
                self.ready
                    .push_back((msg.request, got.into_iter().flatten().collect()));
                self.next(ctx);
            }
        }
    }
}

impl Handler<Forget> for SubgraphActor {
    type Result = ();

    fn handle(&mut self, msg: Forget, _: &mut Self::Context) {
        self.pending.remove(&msg.request);
        self.ready.retain(|(r, _)| *r != msg.request);
    }
}

impl Handler<Stop> for SubgraphActor {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
