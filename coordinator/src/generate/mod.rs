//! Text generation on a generative network, run by the coordinator: the
//! prompt tokenized (chat messages through the model's template), a fresh
//! step over the whole prompt (prefill), then one step per new token
//! (decode). Each step is a request of the sequence ([`requests::infer_step`]):
//! only token ids, mask and positions travel; each stage keeps its part
//! of the KV cache. Tokens stream to the caller as they are picked.
//!
//! When a worker is lost mid-generation the network is re-planned (as for
//! any request) and the sequence's state rebuilt by a fresh step over
//! every token so far; the generation then goes on where it was. With
//! greedy decoding the text is the uninterrupted run's.
//!
//! However it ends (done, failed, the caller gone), every stage is told
//! to free the sequence's state.

mod feed;
mod rounds;
mod sample;
mod text;

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tessera_common::graph::Graph;
use tessera_common::wire::generate::{
    FinishReason, GenerateParams, GenerateStats, GenerationSpec, Prompt,
};
use tokio::sync::mpsc;

use crate::{requests, CoordinatorError, Shared};

/// Rebuilds of a sequence's state (each after a worker loss) before the
/// generation fails.
const MAX_REPLAYS: u32 = 3;

/// What a generative network needs to generate: its text side, its feed
/// and its limits.
pub struct GenerativeModel {
    text: text::Text,
    feed: Arc<feed::Feed>,
    spec: GenerationSpec,
    /// The network's batching task, started by its first generation.
    rounds: OnceLock<rounds::Rounds>,
}

impl GenerativeModel {
    pub fn new(spec: &GenerationSpec, graph: &Graph) -> Result<GenerativeModel, CoordinatorError> {
        let bad = |e: String| CoordinatorError::Model(format!("not generative: {e}"));
        let pairs = graph.state_pairs().map_err(|e| bad(e.to_string()))?;
        Ok(GenerativeModel {
            text: text::Text::new(spec).map_err(|e| bad(e.to_string()))?,
            feed: Arc::new(feed::Feed::new(graph, &pairs).map_err(|e| bad(e.to_string()))?),
            spec: spec.clone(),
            rounds: OnceLock::new(),
        })
    }

    /// The batching task of `network` (this model's), started on first
    /// use.
    fn rounds(&self, shared: &Arc<Shared>, network: u64) -> &rounds::Rounds {
        self.rounds.get_or_init(|| {
            let rows = self.spec.max_sequences as usize;
            rounds::Rounds::start(shared.clone(), network, self.feed.clone(), rows)
        })
    }
}

/// New text of a generation, as it comes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub ids: Vec<u32>,
    pub text: String,
}

/// Generates on `network`, sending chunks to `out` as they come; ends
/// early (as finished) when `out` is closed.
pub async fn generate(
    shared: &Arc<Shared>,
    network: u64,
    prompt: &Prompt,
    params: &GenerateParams,
    out: mpsc::Sender<Chunk>,
) -> Result<GenerateStats, CoordinatorError> {
    let loaded = shared
        .networks
        .get(&network)
        .map(|n| n.clone())
        .ok_or(CoordinatorError::UnknownNetwork(network))?;
    let model = loaded.generator.clone().ok_or_else(|| {
        CoordinatorError::BadInput(format!(
            "network {network} is not generative (load it from a model folder with a tokenizer)"
        ))
    })?;
    let context = model.spec.context_length;
    params
        .check(context)
        .map_err(|e| CoordinatorError::BadInput(e.to_string()))?;
    let prompt_ids = model
        .text
        .prompt_ids(prompt)
        .map_err(|e| CoordinatorError::BadInput(e.to_string()))?;
    if prompt_ids.len() as u64 + u64::from(params.max_tokens) > u64::from(context) {
        return Err(CoordinatorError::BadInput(format!(
            "a prompt of {} tokens and {} new tokens exceed the model's context of {context} positions",
            prompt_ids.len(),
            params.max_tokens
        )));
    }
    let sequence = shared.next_sequence.fetch_add(1, Ordering::Relaxed);
    let rounds = model.rounds(shared, network).clone();
    let _ends = EndOnDrop {
        shared: shared.clone(),
        rounds: rounds.clone(),
        network,
        sequence,
    };
    let mut run = Run {
        rounds,
        model: &model,
        params,
        sequence,
        tokens: prompt_ids,
        started: Instant::now(),
        deadline: (params.deadline_ms > 0).then(|| Duration::from_millis(params.deadline_ms)),
    };
    run.go(out).await
}

/// One generation under way.
struct Run<'a> {
    rounds: rounds::Rounds,
    model: &'a GenerativeModel,
    params: &'a GenerateParams,
    sequence: u64,
    /// The prompt's tokens, then the generated ones.
    tokens: Vec<u32>,
    started: Instant,
    deadline: Option<Duration>,
}

impl Run<'_> {
    async fn go(&mut self, out: mpsc::Sender<Chunk>) -> Result<GenerateStats, CoordinatorError> {
        let prompt_tokens = self.tokens.len();
        let mut sampler = sample::Sampler::new(self.params);
        let mut fresh = true;
        let mut step = 0;
        let mut replays = 0;
        let mut first_token_us = 0;
        let mut sent = 0;
        let model = self.model;
        let mut pieces = model.text.pieces();
        let mut written = String::new();
        let finish = loop {
            step += 1;
            let logits = match self.step(step, fresh).await {
                Ok(logits) => logits,
                Err(CoordinatorError::WorkerLost(e)) if replays < MAX_REPLAYS => {
                    replays += 1;
                    tracing::info!(sequence = self.sequence, "replaying the sequence: {e}");
                    fresh = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            fresh = false;
            let next = sampler
                .pick(&logits)
                .ok_or_else(|| CoordinatorError::Worker("the step gave empty logits".into()))?;
            if first_token_us == 0 {
                first_token_us = self.started.elapsed().as_micros().max(1) as u64;
            }
            if self.model.spec.eos_token_ids.contains(&next) {
                break FinishReason::Stop;
            }
            self.tokens.push(next);
            let generated = self.tokens.len() - prompt_tokens;
            written.push_str(
                &text::piece(&mut pieces, next)
                    .map_err(|e| CoordinatorError::Worker(e.to_string()))?,
            );
            let (new, stopped) = text::releasable(&written, sent, &self.params.stop);
            sent += new.len();
            let chunk = Chunk {
                ids: vec![next],
                text: new.to_string(),
            };
            if out.send(chunk).await.is_err() {
                tracing::debug!(sequence = self.sequence, "the caller left");
                break FinishReason::Stop;
            }
            if stopped {
                break FinishReason::Stop;
            }
            let full = self.tokens.len() >= self.model.spec.context_length as usize;
            if generated >= self.params.max_tokens as usize || full {
                let rest = written.get(sent..).unwrap_or("").to_string();
                if !rest.is_empty() {
                    let _ = out
                        .send(Chunk {
                            ids: Vec::new(),
                            text: rest,
                        })
                        .await;
                }
                break FinishReason::Length;
            }
        };
        Ok(GenerateStats {
            prompt_tokens: prompt_tokens as u32,
            generated_tokens: (self.tokens.len() - prompt_tokens) as u32,
            finish,
            first_token_us,
            total_us: self.started.elapsed().as_micros() as u64,
            replays,
        })
    }

    /// Step number `step`: a fresh one over every token so far, else the
    /// last token (in a batch with other sequences' decode steps).
    async fn step(&self, step: u32, fresh: bool) -> Result<Vec<f32>, CoordinatorError> {
        let until = self.deadline.map(|d| self.started + d);
        let fed = match self.tokens.last() {
            Some(&token) if !fresh => rounds::Fed::Decode {
                token,
                past: (self.tokens.len() - 1) as u32,
            },
            _ => rounds::Fed::Fresh(self.tokens.clone()),
        };
        let ask = rounds::Ask {
            sequence: self.sequence,
            step,
            fed,
            until,
        };
        let answer = self.rounds.step(ask);
        let Some(until) = until else {
            return answer.await;
        };
        tokio::time::timeout_at(tokio::time::Instant::from_std(until), answer)
            .await
            .unwrap_or_else(|_| {
                Err(CoordinatorError::Deadline {
                    request: 0,
                    deadline_ms: self.params.deadline_ms,
                    waiting: format!(" (generating step {step} of sequence {})", self.sequence),
                })
            })
    }
}

/// Tells every stage to free a sequence's state when dropped (through the
/// batching task, which waits for a step of it still in flight).
struct EndOnDrop {
    shared: Arc<Shared>,
    rounds: rounds::Rounds,
    network: u64,
    sequence: u64,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if self.rounds.leave(self.sequence) {
            return;
        }
        let (shared, network, sequence) = (self.shared.clone(), self.network, self.sequence);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { requests::end_sequence(&shared, network, sequence).await });
        }
    }
}
