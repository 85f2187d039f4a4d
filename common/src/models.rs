//! Named models' settings: a `[models.NAME]` table of the coordinator's
//! `cluster.toml`, or the `config` of a load over HTTP or gRPC (the same
//! keys, as JSON), and the load request they make.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::affinity::Policy;
use crate::schedule::Replicas;
use crate::wire::control::{Batching, LoadRequest};
use crate::wire::embed::{EmbeddingSpec, Pooling};
use crate::wire::generate::{GenerationSpec, DEFAULT_MAX_QUEUED, DEFAULT_QUEUE_TIMEOUT_MS};

/// A named model of the repository: `[models.NAME]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The ONNX file (relative paths from the working directory, like
    /// `certs`), or a generative model's folder (`model.onnx` and its
    /// external data, `tokenizer.json`, `tokenizer_config.json`,
    /// `genai_config.json`): it then generates text (`/v1/completions`).
    /// Over HTTP and gRPC, relative to `[serving] model_repository` (and
    /// found there by the model's name when not given).
    #[serde(default)]
    pub path: PathBuf,
    /// Device priority, e.g. `HETERO:node-a/CPU,node-b/CPU` (empty: every
    /// device of every worker).
    #[serde(default)]
    pub devices: String,
    /// `priority` or `cost`.
    #[serde(default)]
    pub policy: Policy,
    /// Refuse a plan that leaves a node without a device.
    #[serde(default)]
    pub strict: bool,
    /// Concrete shapes of graph inputs: `{ x = [1, 3, 48, 320] }`.
    #[serde(default)]
    pub shapes: BTreeMap<String, Vec<u64>>,
    /// Manual affinity: node name → `host/DEVICE`.
    #[serde(default)]
    pub affinity: BTreeMap<String, String>,
    /// Copies to run: a number or `auto`.
    #[serde(default, deserialize_with = "number_or_auto")]
    pub replicas: Replicas,
    /// Dynamic batching: the most requests run as one batch (0 or 1: off).
    #[serde(default)]
    pub max_batch: u32,
    /// How long a request waits for others to join its batch, µs.
    #[serde(default = "default_queue_delay_us")]
    pub max_queue_delay_us: u64,
    /// A generative model: sequences each copy keeps state for at once.
    #[serde(default = "default_max_sequences")]
    pub max_sequences: u32,
    /// A generative model: new sequences that may wait for room on a copy
    /// (beyond: refused as busy, HTTP 429).
    #[serde(default = "default_max_queued")]
    pub max_queued: u32,
    /// A generative model: how long a new sequence may wait for room, ms.
    #[serde(default = "default_queue_timeout_ms")]
    pub queue_timeout_ms: u64,
    /// A generative model: positions one sequence may hold (0: the
    /// model's context, at most 2048).
    #[serde(default)]
    pub context: u32,
    /// A sentence-embedding model (`/v1/embeddings`): its tokenizer and
    /// pooling.
    #[serde(default)]
    pub embedding: Option<EmbeddingConfig>,
}

/// `[models.NAME.embedding]`: an ONNX model that gives token vectors
/// (`input_ids`, `attention_mask` in) served as sentence embeddings.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingConfig {
    /// Its `tokenizer.json` (relative paths as the model's).
    pub tokenizer: PathBuf,
    /// `mean` (of the tokens, padding left out) or `cls` (the first).
    #[serde(default)]
    pub pooling: Pooling,
    /// Each vector scaled to length 1.
    #[serde(default)]
    pub normalize: bool,
    /// The most tokens an input may have, special tokens included (0:
    /// the tokenizer's truncation length, else 512).
    #[serde(default)]
    pub max_length: u32,
    /// The output of the token vectors (empty: the one output of shape
    /// `[batch, tokens, dims]`).
    #[serde(default)]
    pub output: String,
}

impl EmbeddingConfig {
    /// The spec this config makes, its tokenizer to be read by whoever
    /// reads the model's files ([`EmbeddingSpec::with_tokenizer`]).
    pub fn spec(&self) -> EmbeddingSpec {
        EmbeddingSpec {
            tokenizer_path: self.tokenizer.display().to_string(),
            pooling: self.pooling,
            normalize: self.normalize,
            max_length: self.max_length,
            output: self.output.clone(),
            ..EmbeddingSpec::default()
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            path: PathBuf::new(),
            devices: String::new(),
            policy: Policy::default(),
            strict: false,
            shapes: BTreeMap::new(),
            affinity: BTreeMap::new(),
            replicas: Replicas::default(),
            max_batch: 0,
            max_queue_delay_us: DEFAULT_QUEUE_DELAY_US,
            max_sequences: DEFAULT_MAX_SEQUENCES,
            max_queued: DEFAULT_MAX_QUEUED,
            queue_timeout_ms: DEFAULT_QUEUE_TIMEOUT_MS,
            context: 0,
            embedding: None,
        }
    }
}

/// Sequences a generative model's stages keep state for unless told.
pub const DEFAULT_MAX_SEQUENCES: u32 = 4;

fn default_max_sequences() -> u32 {
    DEFAULT_MAX_SEQUENCES
}

fn default_max_queued() -> u32 {
    DEFAULT_MAX_QUEUED
}

fn default_queue_timeout_ms() -> u64 {
    DEFAULT_QUEUE_TIMEOUT_MS
}

/// `replicas = 2` or `replicas = "auto"` (also `"2"`).
fn number_or_auto<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Replicas, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Setting {
        Number(u64),
        Name(String),
    }
    let text = match Setting::deserialize(d)? {
        Setting::Number(n) => n.to_string(),
        Setting::Name(s) => s,
    };
    text.parse().map_err(serde::de::Error::custom)
}

/// The keys of a `[models.NAME]` table.
pub const MODEL_KEYS: [&str; 14] = [
    "path",
    "devices",
    "policy",
    "strict",
    "shapes",
    "affinity",
    "replicas",
    "max_batch",
    "max_queue_delay_us",
    "max_sequences",
    "max_queued",
    "queue_timeout_ms",
    "context",
    "embedding",
];

/// How long a request waits for others to join its batch by default, µs.
pub const DEFAULT_QUEUE_DELAY_US: u64 = 500;

fn default_queue_delay_us() -> u64 {
    DEFAULT_QUEUE_DELAY_US
}

/// What is wrong with a model's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ModelConfigError {
    #[error("a model name is 1-128 of A-Z a-z 0-9 _ . - (not starting with '.')")]
    BadName,
    #[error("the model's file (or generative folder) is required")]
    NoPath,
}

impl ModelConfigError {
    /// The key at fault below `models.NAME` (`""`: the name itself).
    pub fn key(&self) -> &'static str {
        match self {
            ModelConfigError::BadName => "",
            ModelConfigError::NoPath => ".path",
        }
    }

    /// The error as a config file shows it: `models.NAME.key: why`.
    pub fn at(&self, name: &str) -> String {
        format!("models.{name}{}: {self}", self.key())
    }
}

impl ModelConfig {
    /// Checks the model's name and that it has a path.
    pub fn check(&self, name: &str) -> Result<(), ModelConfigError> {
        if !valid_model_name(name) {
            return Err(ModelConfigError::BadName);
        }
        if self.path.as_os_str().is_empty() {
            return Err(ModelConfigError::NoPath);
        }
        Ok(())
    }
}

/// Whether `name` can name a model in URLs and metrics: 1–128 of
/// `[A-Za-z0-9_.-]`, not starting with a dot.
pub fn valid_model_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl ModelConfig {
    /// The load this table asks for, as model `name`; `generative` when
    /// its path is a generative model's folder (its tokenizer and limits
    /// are read when it loads).
    pub fn load_request(&self, name: &str, generative: bool) -> LoadRequest {
        LoadRequest {
            name: name.to_string(),
            devices: self.devices.clone(),
            policy: self.policy,
            strict: self.strict,
            affinity: self
                .affinity
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            dry_run: false,
            shapes: self
                .shapes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            replicas: self.replicas,
            batching: (self.max_batch > 1).then_some(Batching {
                max_batch: self.max_batch,
                max_queue_delay_us: self.max_queue_delay_us,
            }),
            generation: generative.then(|| GenerationSpec {
                tokenizer_json: String::new(),
                tokenizer_bytes: 0,
                chat_template: None,
                bos_token: None,
                eos_token: None,
                eos_token_ids: Vec::new(),
                context_length: self.context,
                max_sequences: self.max_sequences,
                max_queued: self.max_queued,
                queue_timeout_ms: self.queue_timeout_ms,
            }),
            // The tokenizer is read by whoever reads the model's files.
            embedding: self.embedding.as_ref().map(EmbeddingConfig::spec),
        }
    }
}
