//! Text generation, driven by the requester: a GGUF file or a model
//! folder (the Hugging Face / onnxruntime-genai layout: `model.onnx` with
//! its external data, `tokenizer.json`, `tokenizer_config.json`,
//! `genai_config.json`) read and loaded as a generative network, and [`Network::generate`] streaming
//! its text.
//!
//! The requester tokenizes the prompt ([`text`]), sends each step straight
//! to the workers of the sequence's copy (a copy's steps batched by
//! [`driver`]), gets back the token the last stage drew from the logits
//! (greedy or sampled there, with the request's seed), detokenizes it and
//! releases the text up to any stop string
//! ([`tessera_common::generation::emitter`]). A worker lost mid-generation
//! is replayed: a fresh step over every token so far, which draws the same
//! tokens after.

pub mod driver;
pub mod text;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tessera_common::generation::emitter::Emitter;
use tessera_common::generation::feed::Feed;
use tessera_common::wire::client::{ClientReply, ClientRequest};
use tessera_common::wire::control::ErrorKind;
use tessera_common::wire::data::{SampledToken, Sampling};
pub use tessera_common::wire::generate::{
    ChatMessage, FinishReason, GenerateParams, GenerateStats, GenerationSpec, Prompt,
};
use tessera_common::wire::message::Message as _;
use tessera_common::wire::routes::{CopyState, RoutingTable};
use tokio::sync::mpsc;

use crate::{ClientError, Network, Operation};
use driver::{Copy, Fed, Step};
use text::Text;

/// A generative model read from its path: a GGUF file or a model folder.
pub struct ModelFolder {
    /// The encoded ONNX model, weights inline.
    pub model: Bytes,
    pub generation: GenerationSpec,
    /// The model's SHA-256, remembered by its files
    /// ([`crate::LoadOptions::model_sha256`]).
    pub model_sha256: Option<String>,
}

impl ModelFolder {
    /// Reads the GGUF file or model folder at `path` (a GGUF is built, or
    /// taken from the build cache); each copy will keep state for up to
    /// `max_sequences` sequences at once.
    pub fn read(path: &Path, max_sequences: u32) -> Result<ModelFolder, ClientError> {
        Self::read_with(path, max_sequences, &tessera_gguf::BuildOptions::default())
    }

    /// [`ModelFolder::read`], a GGUF built with `options` (a folder's
    /// graph is as its files have it).
    pub fn read_with(
        path: &Path,
        max_sequences: u32,
        options: &tessera_gguf::BuildOptions,
    ) -> Result<ModelFolder, ClientError> {
        let read = tessera_gguf::generative::read_with(path, max_sequences, options)
            .map_err(|e| ClientError::Model(e.to_string()))?;
        Ok(ModelFolder {
            model: read.model,
            generation: read.spec,
            model_sha256: read.model_sha256,
        })
    }
}

/// What a generation sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New tokens and their text (the text may lag a token, or hold back
    /// what could begin a stop string), with their log-probabilities when
    /// asked for.
    Tokens {
        ids: Vec<u32>,
        text: String,
        logprobs: Vec<SampledToken>,
    },
    /// The generation ended.
    Done(GenerateStats),
}

/// A generation under way: its events in order ([`Generation::next`]).
/// Dropping it ends the generation (the stages free its state).
pub struct Generation {
    rx: mpsc::Receiver<Result<Event, ClientError>>,
    task: tokio::task::JoinHandle<()>,
    done: bool,
    generator: Arc<Generator>,
}

impl Drop for Generation {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Generation {
    /// A token's text on its own (for log-probabilities' tokens).
    pub fn token(&self, id: u32) -> String {
        self.generator.text.token(id)
    }

    /// The next event; `None` after [`Event::Done`].
    pub async fn next(&mut self) -> Result<Option<Event>, ClientError> {
        if self.done {
            return Ok(None);
        }
        match self.rx.recv().await {
            Some(Ok(event)) => {
                self.done = matches!(event, Event::Done(_));
                Ok(Some(event))
            }
            Some(Err(e)) => {
                self.done = true;
                Err(e)
            }
            None => Err(ClientError::Protocol(
                "the generation ended without figures".into(),
            )),
        }
    }

    /// Every event until the end: the whole text and the figures.
    pub async fn collect(mut self) -> Result<(String, Vec<u32>, GenerateStats), ClientError> {
        let (mut text, mut ids) = (String::new(), Vec::new());
        while let Some(event) = self.next().await? {
            match event {
                Event::Tokens {
                    ids: i, text: t, ..
                } => {
                    ids.extend(i);
                    text.push_str(&t);
                }
                Event::Done(stats) => return Ok((text, ids, stats)),
            }
        }
        Err(ClientError::Protocol(
            "the generation ended without figures".into(),
        ))
    }
}

/// A generative network at its requester: its tokenizer, feed and limits,
/// and one batching task per copy.
pub struct Generator {
    text: Text,
    feed: Arc<Feed>,
    spec: GenerationSpec,
    copies: Mutex<HashMap<u32, Copy>>,
    /// This requester's sequences on each copy.
    live: Mutex<HashMap<u32, u32>>,
}

/// Replays of one sequence (each after a worker loss) before it fails.
const MAX_REPLAYS: u32 = 3;

/// A random seed for a request without one.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

impl Network {
    /// Starts generating on this (generative) network. The prompt is
    /// tokenized here; the steps go straight to the workers.
    pub async fn generate(
        &self,
        prompt: Prompt,
        params: GenerateParams,
    ) -> Result<Generation, ClientError> {
        let generator = self.generator().await?;
        let ids = generator
            .text
            .prompt_ids(&prompt)
            .map_err(|e| failed(ErrorKind::BadInput, e.to_string()))?;
        let context = generator.spec.context_length;
        params
            .check(context)
            .map_err(|e| failed(ErrorKind::BadInput, e.to_string()))?;
        if ids.len() + params.max_tokens as usize > context as usize {
            return Err(failed(
                ErrorKind::BadInput,
                format!(
                    "a prompt of {} tokens and {} new tokens exceed the model's context of {context} positions",
                    ids.len(),
                    params.max_tokens
                ),
            ));
        }
        // A caller that does not read holds its generation back (and its
        // state on the stages) once this many events wait.
        let (tx, rx) = mpsc::channel(16);
        let network = self.detached();
        let run_generator = generator.clone();
        let task = tokio::spawn(async move {
            let mut run = Run::new(run_generator, network, ids, params);
            let result = run.go(&tx).await;
            let _ = tx.send(result.map(Event::Done)).await;
        });
        Ok(Generation {
            rx,
            task,
            done: false,
            generator,
        })
    }

    /// The prompt's token ids as this (generative) network is fed them,
    /// special tokens added as `special` says (`None`: as when it
    /// generates), and its context in positions.
    pub async fn tokenize(
        &self,
        prompt: &Prompt,
        special: Option<bool>,
    ) -> Result<(Vec<u32>, u32), ClientError> {
        let generator = self.generator().await?;
        let ids = generator
            .text
            .ids(prompt, special)
            .map_err(|e| failed(ErrorKind::BadInput, e.to_string()))?;
        Ok((ids, generator.spec.context_length))
    }

    /// The text of token ids of this (generative) network's vocabulary.
    pub async fn detokenize(&self, ids: &[u32]) -> Result<String, ClientError> {
        let generator = self.generator().await?;
        generator
            .text
            .decode(ids)
            .map_err(|e| failed(ErrorKind::BadInput, e.to_string()))
    }

    /// This network's generator (its spec fetched from the coordinator
    /// once).
    async fn generator(&self) -> Result<Arc<Generator>, ClientError> {
        self.generator
            .get_or_try_init(|| async {
                let table = self
                    .routes
                    .table()
                    .ok_or_else(|| failed(ErrorKind::Unavailable, "no routing table".into()))?;
                let name = &table.name;
                let limits = table.generation.as_ref().ok_or_else(|| {
                    failed(
                        ErrorKind::BadInput,
                        format!("model '{name}' does not generate"),
                    )
                })?;
                let feed = Feed::new(&table.signature, &limits.state)
                    .map_err(|e| failed(ErrorKind::BadInput, format!("model '{name}': {e}")))?;
                let spec = self.client.generation_spec(table.network).await?;
                let text = Text::new(&spec)
                    .map_err(|e| failed(ErrorKind::BadInput, format!("model '{name}': {e}")))?;
                Ok(Arc::new(Generator {
                    text,
                    feed: Arc::new(feed),
                    spec,
                    copies: Mutex::new(HashMap::new()),
                    live: Mutex::new(HashMap::new()),
                }))
            })
            .await
            .cloned()
    }
}

impl crate::Client {
    /// A generative network's spec and tokenizer.
    pub(crate) async fn generation_spec(
        &self,
        network: u64,
    ) -> Result<GenerationSpec, ClientError> {
        let op = Operation::Generate;
        let msg = ClientRequest::Generation { network };
        match self.ask_with_payload(op, &msg).await? {
            (ClientReply::Generation(spec), payload) => {
                let mut spec = *spec;
                spec.split_payload(payload)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                Ok(spec)
            }
            (other, _) => Err(ClientError::unexpected(op, &other)),
        }
    }

    /// `msg`'s one reply and its payload (a spec and its tokenizer); a
    /// `Failed` reply is the error.
    pub(crate) async fn ask_with_payload(
        &self,
        op: Operation,
        msg: &ClientRequest,
    ) -> Result<(ClientReply, Bytes), ClientError> {
        let limits = self.limits();
        let (mut send, mut recv) = self.open().await?;
        tessera_net::exchange::send_message(&mut send, msg, None, &limits)
            .await
            .map_err(ClientError::Transport)?;
        let _ = send.finish();
        let frame = tessera_net::recv_frame::<ClientReply>(&mut recv, &limits)
            .await
            .map_err(ClientError::Transport)?;
        match frame {
            Some(tessera_common::wire::Frame::Control(ClientReply::Failed(f), _)) => {
                Err(ClientError::Failed {
                    op,
                    kind: f.kind,
                    message: f.error,
                })
            }
            Some(tessera_common::wire::Frame::Control(reply, payload)) => Ok((reply, payload)),
            _ => Err(ClientError::Protocol(format!(
                "no answer to {}",
                msg.name()
            ))),
        }
    }
}

fn failed(kind: ErrorKind, message: String) -> ClientError {
    ClientError::Failed {
        op: Operation::Generate,
        kind,
        message,
    }
}

impl Generator {
    /// The copy a new sequence goes to: a ready one not in `not`, with the
    /// fewest sequences (this requester's, then what its workers report).
    fn choose(&self, table: &RoutingTable, not: &[u32]) -> Option<u32> {
        let live = self.live.lock().map(|l| l.clone()).unwrap_or_default();
        table
            .copies
            .iter()
            .filter(|c| c.state == CopyState::Ready && c.deployment.is_some())
            .filter(|c| !not.contains(&c.index))
            .min_by_key(|c| {
                let mine = live.get(&c.index).copied().unwrap_or(0);
                (mine, c.load.sequences + c.load.waiting)
            })
            .map(|c| c.index)
    }

    /// The batching task of copy `copy`, started on first use.
    fn copy(&self, network: &Network, table: &RoutingTable, copy: u32) -> Copy {
        let mut copies = self.copies.lock().unwrap_or_else(|p| p.into_inner());
        copies
            .entry(copy)
            .or_insert_with(|| {
                let stages = table
                    .copies
                    .iter()
                    .find(|c| c.index == copy)
                    .and_then(|c| c.deployment.as_ref())
                    .map_or(1, |d| d.hosts.len());
                let max_rows = table.generation.as_ref().map_or(1, |g| g.max_sequences);
                Copy::start(
                    network.detached(),
                    copy,
                    self.feed.clone(),
                    stages,
                    max_rows as usize,
                )
            })
            .clone()
    }

    fn count(&self, copy: u32, delta: i32) {
        if let Ok(mut live) = self.live.lock() {
            let n = live.entry(copy).or_default();
            *n = n.saturating_add_signed(delta);
        }
    }
}

/// One generation under way.
struct Run {
    generator: Arc<Generator>,
    network: Network,
    params: GenerateParams,
    seed: u64,
    sequence: u64,
    /// The prompt's tokens, then the generated ones.
    tokens: Vec<u32>,
    prompt: usize,
    started: Instant,
    /// The copy that holds the sequence's state, and its batching.
    placed: Option<(u32, Copy)>,
}

impl Drop for Run {
    fn drop(&mut self) {
        self.leave();
    }
}

impl Run {
    fn new(
        generator: Arc<Generator>,
        network: Network,
        tokens: Vec<u32>,
        params: GenerateParams,
    ) -> Run {
        Run {
            seed: params.seed.unwrap_or_else(random_seed),
            sequence: network.client.inner.ids.next(),
            prompt: tokens.len(),
            generator,
            network,
            params,
            tokens,
            started: Instant::now(),
            placed: None,
        }
    }

    /// Frees the sequence's state on its copy.
    fn leave(&mut self) {
        if let Some((copy, batching)) = self.placed.take() {
            batching.leave(self.sequence);
            self.generator.count(copy, -1);
        }
    }

    fn until(&self) -> Instant {
        match self.params.deadline_ms {
            0 => Instant::now() + crate::DEFAULT_DEADLINE,
            ms => self.started + Duration::from_millis(ms),
        }
    }

    async fn go(
        &mut self,
        out: &mpsc::Sender<Result<Event, ClientError>>,
    ) -> Result<GenerateStats, ClientError> {
        let generator = self.generator.clone();
        let mut pieces = generator.text.pieces();
        let mut emitter = Emitter::new(&self.params.stop);
        let (mut fresh, mut number, mut replays, mut first_token_us) = (true, 0u32, 0, 0);
        let finish = loop {
            number += 1;
            let token = match self.step(number, fresh).await {
                Ok(token) => token,
                Err(e) if replays < MAX_REPLAYS && replayable(&e) => {
                    replays += 1;
                    tracing::info!(sequence = self.sequence, "replaying the sequence: {e}");
                    fresh = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            fresh = false;
            if first_token_us == 0 {
                first_token_us = self.started.elapsed().as_micros().max(1) as u64;
            }
            let next = token.id;
            if self.generator.spec.eos_token_ids.contains(&next) {
                let rest = emitter.finish();
                self.emit(out, Vec::new(), rest, Vec::new()).await;
                break FinishReason::Stop;
            }
            self.tokens.push(next);
            let piece = text::piece(&mut pieces, next)
                .map_err(|e| failed(ErrorKind::Internal, e.to_string()))?;
            let released = emitter.push(&piece);
            let logprobs = if self.params.logprobs > 0 {
                vec![token]
            } else {
                Vec::new()
            };
            if !self.emit(out, vec![next], released.text, logprobs).await {
                break FinishReason::Stop;
            }
            if released.stopped {
                break FinishReason::Stop;
            }
            let generated = self.tokens.len() - self.prompt;
            let full = self.tokens.len() >= self.generator.spec.context_length as usize;
            if generated >= self.params.max_tokens as usize || full {
                let rest = emitter.finish();
                self.emit(out, Vec::new(), rest, Vec::new()).await;
                break FinishReason::Length;
            }
        };
        Ok(GenerateStats {
            prompt_tokens: self.prompt as u32,
            generated_tokens: (self.tokens.len() - self.prompt) as u32,
            finish,
            first_token_us,
            total_us: self.started.elapsed().as_micros() as u64,
            replays,
        })
    }

    /// Sends new tokens and their text (nothing when both are empty);
    /// `false` when the caller left.
    async fn emit(
        &self,
        out: &mpsc::Sender<Result<Event, ClientError>>,
        ids: Vec<u32>,
        text: String,
        logprobs: Vec<SampledToken>,
    ) -> bool {
        if ids.is_empty() && text.is_empty() {
            return true;
        }
        out.send(Ok(Event::Tokens {
            ids,
            text,
            logprobs,
        }))
        .await
        .is_ok()
    }

    /// Step number `number`: a fresh one over every token so far (on a
    /// copy with room: one busy is left for another), else the last token
    /// (batched with other sequences' decode steps on its copy).
    async fn step(&mut self, number: u32, fresh: bool) -> Result<SampledToken, ClientError> {
        let sampling = Sampling {
            temperature: self.params.temperature,
            top_k: self.params.top_k,
            top_p: self.params.top_p,
            seed: self.seed,
            index: (self.tokens.len() - self.prompt) as u32,
            logprobs: self.params.logprobs,
        };
        if !fresh {
            let Some((_, copy)) = &self.placed else {
                return Err(failed(
                    ErrorKind::Internal,
                    "a decode step of no copy".into(),
                ));
            };
            let fed = Fed::Decode {
                token: *self.tokens.last().unwrap_or(&0),
                past: (self.tokens.len() - 1) as u32,
            };
            let step = self.ask(number, fed, sampling);
            return copy.step(step).await;
        }
        self.leave();
        let mut busy: Vec<u32> = Vec::new();
        loop {
            let table = self
                .network
                .routes()
                .ok_or_else(|| failed(ErrorKind::Unavailable, "no routing table".into()))?;
            let Some(index) = self.generator.choose(&table, &busy) else {
                if !busy.is_empty() {
                    return Err(failed(
                        ErrorKind::Busy,
                        "every copy keeps as many sequences as it may and its queue is full".into(),
                    ));
                }
                // Copies being re-planned (a lost worker): wait for one.
                if !self.network.routes_changed(self.until()).await {
                    return Err(failed(ErrorKind::Unavailable, "no copy is ready".into()));
                }
                continue;
            };
            let copy = self.generator.copy(&self.network, &table, index);
            self.generator.count(index, 1);
            self.placed = Some((index, copy.clone()));
            let step = self.ask(number, Fed::Fresh(self.tokens.clone()), sampling);
            match copy.step(step).await {
                Err(e) if e.kind() == ErrorKind::Busy => {
                    self.leave();
                    busy.push(index);
                }
                outcome => return outcome,
            }
        }
    }

    fn ask(&self, number: u32, fed: Fed, sampling: Sampling) -> Step {
        Step {
            sequence: self.sequence,
            number,
            fed,
            sampling,
            until: self.until(),
        }
    }
}

/// Whether a step's failure is a lost worker (its state gone with it):
/// the sequence is replayed.
fn replayable(e: &ClientError) -> bool {
    matches!(e.kind(), ErrorKind::WorkerLost | ErrorKind::Unavailable)
}
