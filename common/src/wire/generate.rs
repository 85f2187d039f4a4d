//! Text generation on the wire: what a generative network brings with it
//! (its tokenizer, chat template and limits), what a client asks for (a
//! prompt and sampling settings) and what streams back (tokens, then the
//! figures). The settings are checked here, before anything runs.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// One step of a stateful sequence: a row of a request's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SequenceStep {
    /// The sequence (unique per coordinator).
    pub id: u64,
    /// The step's number in its sequence (one more each step, a replay
    /// included): a stage keeps the state a step makes for the next one.
    pub step: u32,
    /// The request carries the state inputs itself (the first step, or a
    /// replay after a worker loss): stages start the sequence's state
    /// afresh. Otherwise they use the state kept from the previous step.
    pub fresh: bool,
    /// Positions of state the sequence holds before this step (0 when
    /// fresh).
    pub past: u32,
}

/// The sequence steps a request is: one per row of its tensors, in row
/// order. Several rows are decode steps of different sequences run as one
/// batch (continuous batching); each row's kept state is padded with
/// zeros to `positions` along its positions axis (before its positions,
/// or after them where the model says so) and the attention mask masks
/// the padding, and each row keeps only its own positions after.
/// A fresh step is always alone.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Steps {
    pub rows: Vec<SequenceStep>,
    /// Positions every row's state is padded to: the longest `past`.
    pub positions: u32,
}

impl Steps {
    /// One step alone.
    pub fn one(step: SequenceStep) -> Steps {
        Steps::batch(vec![step])
    }

    /// Decode steps of several sequences as one batch.
    pub fn batch(rows: Vec<SequenceStep>) -> Steps {
        let positions = rows.iter().map(|r| r.past).max().unwrap_or(0);
        Steps { rows, positions }
    }

    /// Whether it is a fresh step (state given, not kept).
    pub fn fresh(&self) -> bool {
        self.rows.iter().any(|r| r.fresh)
    }

    /// The first row's sequence (for logs).
    pub fn first_id(&self) -> Option<u64> {
        self.rows.first().map(|r| r.id)
    }

    /// Checks what a peer sent: at least one row, a fresh step alone,
    /// `positions` the longest row's `past`, no sequence twice.
    pub fn check(&self) -> Result<(), GenerationError> {
        if self.rows.is_empty() {
            return Err(GenerationError::NoRows);
        }
        if self.fresh() && self.rows.len() > 1 {
            return Err(GenerationError::FreshBatched);
        }
        if let Some(r) = self.rows.iter().find(|r| r.past > self.positions) {
            return Err(GenerationError::RowPastBatch {
                sequence: r.id,
                past: r.past,
                positions: self.positions,
            });
        }
        let longest = self.rows.iter().map(|r| r.past).max().unwrap_or(0);
        if !self.fresh() && longest != self.positions {
            return Err(GenerationError::BadPadding {
                positions: self.positions,
                longest,
            });
        }
        let mut ids: Vec<u64> = self.rows.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(GenerationError::SequenceTwice(w[0]));
        }
        Ok(())
    }
}

/// What a generative network brings: read from its model folder (the
/// Hugging Face / onnxruntime-genai layout) by whoever loads it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationSpec {
    /// `tokenizer.json` (Hugging Face tokenizers). Megabytes, so on the
    /// wire it follows the model in the load's payload rather than in the
    /// header ([`GenerationSpec::join_payload`]).
    #[serde(skip)]
    pub tokenizer_json: String,
    /// The tokenizer's length at the end of the payload, bytes.
    pub tokenizer_bytes: u64,
    /// The chat template (Jinja), if the model has one.
    pub chat_template: Option<String>,
    /// Token strings the template may use.
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// Token ids that end a generation.
    pub eos_token_ids: Vec<u32>,
    /// The most positions (prompt and generated) one sequence may hold.
    pub context_length: u32,
    /// Sequences each copy keeps state for at once.
    pub max_sequences: u32,
    /// Fresh sequences that may wait for room on a copy; beyond them a new
    /// sequence is refused as busy.
    pub max_queued: u32,
    /// How long a fresh sequence may wait for room, ms.
    pub queue_timeout_ms: u64,
}

/// A chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// What to continue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Prompt {
    /// Plain text, tokenized as it is.
    Text(String),
    /// Messages rendered through the model's chat template (with the
    /// assistant's turn opened).
    Chat(Vec<ChatMessage>),
}

/// How to pick tokens and when to stop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateParams {
    /// New tokens at most (at least 1).
    pub max_tokens: u32,
    /// 0: greedy (the most likely token).
    pub temperature: f32,
    /// Sample among the `top_k` most likely (0: all).
    pub top_k: u32,
    /// Sample among the most likely whose probabilities add up to `top_p`
    /// (1: all).
    pub top_p: f32,
    /// The sampler's seed (the same seed, the same text); none: a random
    /// one.
    pub seed: Option<u64>,
    /// Answer each token's log-probability and those of the `logprobs`
    /// most likely (0: none).
    pub logprobs: u32,
    /// Texts that end the generation (not included in it).
    pub stop: Vec<String>,
    /// Milliseconds for the whole generation (0: the coordinator's request
    /// deadline for each step).
    pub deadline_ms: u64,
}

impl Default for GenerateParams {
    fn default() -> GenerateParams {
        GenerateParams {
            max_tokens: 128,
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: None,
            logprobs: 0,
            stop: Vec::new(),
            deadline_ms: 0,
        }
    }
}

impl GenerationSpec {
    /// The load's payload: `model`, then the tokenizer (its length noted).
    pub fn join_payload(&mut self, model: &[u8]) -> Bytes {
        self.tokenizer_bytes = self.tokenizer_json.len() as u64;
        join_tokenizer(model, &self.tokenizer_json)
    }

    /// The model of a load's payload; the tokenizer at its end is taken
    /// into the spec.
    pub fn split_payload(&mut self, payload: Bytes) -> Result<Bytes, GenerationError> {
        let (model, tokenizer) = split_tokenizer(payload, self.tokenizer_bytes)?;
        self.tokenizer_json = tokenizer;
        Ok(model)
    }
}

/// A load's payload with a tokenizer after the model (a generative or an
/// embedding network's: megabytes, so not in the header).
pub fn join_tokenizer(model: &[u8], tokenizer: &str) -> Bytes {
    let mut payload = Vec::with_capacity(model.len() + tokenizer.len());
    payload.extend_from_slice(model);
    payload.extend_from_slice(tokenizer.as_bytes());
    payload.into()
}

/// The model and the tokenizer of a payload whose last `len` bytes are
/// the tokenizer.
pub fn split_tokenizer(payload: Bytes, len: u64) -> Result<(Bytes, String), TokenizerTail> {
    let n = usize::try_from(len)
        .ok()
        .filter(|&n| n <= payload.len())
        .ok_or(TokenizerTail::PastPayload {
            tokenizer: len,
            payload: payload.len() as u64,
        })?;
    let at = payload.len() - n;
    let tokenizer = std::str::from_utf8(&payload[at..])
        .map_err(|e| TokenizerTail::NotUtf8(e.to_string()))?
        .to_string();
    Ok((payload.slice(..at), tokenizer))
}

/// Why a load's payload has no tokenizer at its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizerTail {
    #[error("the load announces a tokenizer of {tokenizer} bytes in a payload of {payload}")]
    PastPayload { tokenizer: u64, payload: u64 },
    #[error("tokenizer.json is not UTF-8: {0}")]
    NotUtf8(String),
}

impl GenerateParams {
    /// Checks the settings against themselves and a context of
    /// `context_length` positions.
    pub fn check(&self, context_length: u32) -> Result<(), GenerationError> {
        if self.max_tokens == 0 {
            return Err(GenerationError::NoTokens);
        }
        if self.max_tokens >= context_length {
            return Err(GenerationError::BeyondContext {
                max_tokens: self.max_tokens,
                context_length,
            });
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(GenerationError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(GenerationError::TopP(self.top_p));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(GenerationError::EmptyStop);
        }
        Ok(())
    }
}

/// What is wrong with a generation's settings, a generative model's files
/// or a sequence step a peer sent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GenerationError {
    #[error("a sequence step without rows")]
    NoRows,
    #[error("a fresh step batched with others")]
    FreshBatched,
    #[error("sequence {sequence} holds {past} positions, more than the batch's {positions}")]
    RowPastBatch {
        sequence: u64,
        past: u32,
        positions: u32,
    },
    #[error("a batch padded to {positions} positions whose longest row holds {longest}")]
    BadPadding { positions: u32, longest: u32 },
    #[error("sequence {0} twice in one batch")]
    SequenceTwice(u64),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerTail),
    #[error("max tokens must be at least 1")]
    NoTokens,
    #[error("max tokens {max_tokens} is beyond the model's context of {context_length} positions")]
    BeyondContext {
        max_tokens: u32,
        context_length: u32,
    },
    #[error("temperature must be a number ≥ 0, not {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], not {0}")]
    TopP(f32),
    #[error("a stop string is empty")]
    EmptyStop,
    #[error("{file} is not valid JSON: {reason}")]
    Json { file: &'static str, reason: String },
    #[error(
        "no end-of-sequence token: genai_config.json has no model.eos_token_id and \
         tokenizer_config.json no eos_token in the vocabulary"
    )]
    NoEndOfSequence,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
}

impl FinishReason {
    /// OpenAI's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// A generation's figures, sent when it ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateStats {
    pub prompt_tokens: u32,
    pub generated_tokens: u32,
    pub finish: FinishReason,
    /// From the request to the first new token, µs.
    pub first_token_us: u64,
    /// The whole generation, µs.
    pub total_us: u64,
    /// Times the sequence's state was rebuilt by replaying its tokens
    /// (after a worker was lost).
    pub replays: u32,
}

/// What a model folder's files say, for [`GenerationSpec::from_files`].
pub struct FolderFiles<'a> {
    /// `tokenizer.json`.
    pub tokenizer_json: &'a str,
    /// `tokenizer_config.json`, if present.
    pub tokenizer_config: Option<&'a str>,
    /// `genai_config.json`, if present.
    pub genai_config: Option<&'a str>,
}

/// Context length when no file gives one.
const DEFAULT_CONTEXT: u32 = 2048;
/// Fresh sequences that may wait for room on a copy, unless set.
pub const DEFAULT_MAX_QUEUED: u32 = 64;
/// How long a fresh sequence may wait for room, unless set, ms.
pub const DEFAULT_QUEUE_TIMEOUT_MS: u64 = 30_000;

impl GenerationSpec {
    /// The spec from a model folder's files (the Hugging Face /
    /// onnxruntime-genai layout): the tokenizer, the chat template and
    /// special tokens from `tokenizer_config.json`, the end-of-sequence
    /// ids and context length from `genai_config.json` (else from the
    /// tokenizer's `eos_token`).
    pub fn from_files(
        files: &FolderFiles<'_>,
        max_sequences: u32,
    ) -> Result<GenerationSpec, GenerationError> {
        let parse = |file: &'static str, text: &str| {
            serde_json::from_str::<serde_json::Value>(text).map_err(|e| GenerationError::Json {
                file,
                reason: e.to_string(),
            })
        };
        let tokenizer = parse("tokenizer.json", files.tokenizer_json)?;
        let tok_config = files
            .tokenizer_config
            .map(|t| parse("tokenizer_config.json", t))
            .transpose()?
            .unwrap_or(serde_json::Value::Null);
        let genai = files
            .genai_config
            .map(|t| parse("genai_config.json", t))
            .transpose()?
            .unwrap_or(serde_json::Value::Null);
        let token_text = |key: &str| match &tok_config[key] {
            serde_json::Value::String(s) => Some(s.clone()),
            v => v["content"].as_str().map(str::to_string),
        };
        let (bos_token, eos_token) = (token_text("bos_token"), token_text("eos_token"));
        let model = &genai["model"];
        let mut eos_token_ids: Vec<u32> = match &model["eos_token_id"] {
            serde_json::Value::Array(ids) => ids.iter().filter_map(json_id).collect(),
            v => json_id(v).into_iter().collect(),
        };
        if eos_token_ids.is_empty() {
            eos_token_ids.extend(eos_token.as_deref().and_then(|t| token_id(&tokenizer, t)));
        }
        if eos_token_ids.is_empty() {
            return Err(GenerationError::NoEndOfSequence);
        }
        let context_length = model["context_length"]
            .as_u64()
            .or_else(|| tok_config["model_max_length"].as_u64())
            .map_or(DEFAULT_CONTEXT, |c| c.min(u64::from(u32::MAX)) as u32);
        Ok(GenerationSpec {
            tokenizer_json: files.tokenizer_json.to_string(),
            tokenizer_bytes: files.tokenizer_json.len() as u64,
            chat_template: tok_config["chat_template"].as_str().map(str::to_string),
            bos_token,
            eos_token,
            eos_token_ids,
            context_length,
            max_sequences,
            max_queued: DEFAULT_MAX_QUEUED,
            queue_timeout_ms: DEFAULT_QUEUE_TIMEOUT_MS,
        })
    }
}

/// Positions a generative model's sequences hold unless its table or
/// request says: its own context, at most this.
pub const DEFAULT_SERVED_CONTEXT: u32 = 2048;

impl GenerationSpec {
    /// The spec a model's files give, with the limits a `[models.NAME]`
    /// table or a load asks for (`wanted`): its context (0: the model's,
    /// at most [`DEFAULT_SERVED_CONTEXT`]; never beyond the model's), its
    /// queue's length and timeout.
    pub fn limited_by(mut self, wanted: &GenerationSpec) -> GenerationSpec {
        self.context_length = match wanted.context_length {
            0 => self.context_length.min(DEFAULT_SERVED_CONTEXT),
            c => c.min(self.context_length),
        };
        self.max_sequences = wanted.max_sequences;
        self.max_queued = wanted.max_queued;
        self.queue_timeout_ms = wanted.queue_timeout_ms;
        self
    }
}

fn json_id(v: &serde_json::Value) -> Option<u32> {
    v.as_u64().and_then(|i| u32::try_from(i).ok())
}

/// A token's id in a `tokenizer.json`: an added token or the vocabulary's.
fn token_id(tokenizer: &serde_json::Value, token: &str) -> Option<u32> {
    let added = tokenizer["added_tokens"].as_array().and_then(|tokens| {
        tokens
            .iter()
            .find(|t| t["content"].as_str() == Some(token))
            .and_then(|t| json_id(&t["id"]))
    });
    added.or_else(|| json_id(&tokenizer["model"]["vocab"][token]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKENIZER: &str =
        r#"{"added_tokens":[{"id":2,"content":"<|im_end|>"}],"model":{"vocab":{"a":0,"</s>":5}}}"#;

    #[test]
    fn spec_from_genai_config_and_tokenizer_config() {
        let files = FolderFiles {
            tokenizer_json: TOKENIZER,
            tokenizer_config: Some(
                r#"{"eos_token":{"content":"<|im_end|>"},"bos_token":"<s>","chat_template":"{{ x }}"}"#,
            ),
            genai_config: Some(r#"{"model":{"eos_token_id":[2,5],"context_length":512}}"#),
        };
        let spec = GenerationSpec::from_files(&files, 4).expect("spec");
        assert_eq!(spec.eos_token_ids, vec![2, 5]);
        assert_eq!(spec.context_length, 512);
        assert_eq!(spec.eos_token.as_deref(), Some("<|im_end|>"));
        assert_eq!(spec.bos_token.as_deref(), Some("<s>"));
        assert_eq!(spec.chat_template.as_deref(), Some("{{ x }}"));
        let mut sent = spec.clone();
        let payload = sent.join_payload(b"model");
        let mut received = sent.clone();
        received.tokenizer_json.clear();
        assert_eq!(
            received.split_payload(payload).expect("split"),
            &b"model"[..]
        );
        assert_eq!(received, spec);
        received.tokenizer_bytes = 1 << 40;
        let err = received
            .split_payload(Bytes::from_static(b"x"))
            .unwrap_err();
        assert_eq!(
            err,
            GenerationError::Tokenizer(TokenizerTail::PastPayload {
                tokenizer: 1 << 40,
                payload: 1
            })
        );
        assert!(err.to_string().contains("announces a tokenizer"), "{err}");
    }

    #[test]
    fn eos_from_the_vocabulary_and_errors() {
        let files = FolderFiles {
            tokenizer_json: TOKENIZER,
            tokenizer_config: Some(r#"{"eos_token":"</s>"}"#),
            genai_config: None,
        };
        let spec = GenerationSpec::from_files(&files, 1).expect("spec");
        assert_eq!(spec.eos_token_ids, vec![5]);
        assert_eq!(spec.context_length, DEFAULT_CONTEXT);
        let none = FolderFiles {
            tokenizer_json: TOKENIZER,
            tokenizer_config: None,
            genai_config: None,
        };
        let err = GenerationSpec::from_files(&none, 1).unwrap_err();
        assert_eq!(err, GenerationError::NoEndOfSequence);
        let bad = FolderFiles {
            tokenizer_json: "{",
            tokenizer_config: None,
            genai_config: None,
        };
        let err = GenerationSpec::from_files(&bad, 1).unwrap_err();
        assert!(
            matches!(
                err,
                GenerationError::Json {
                    file: "tokenizer.json",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("tokenizer.json is not valid JSON"));
    }

    #[test]
    fn params_are_checked() {
        let ok = GenerateParams::default();
        assert!(ok.check(512).is_ok());
        let zero = GenerateParams {
            max_tokens: 0,
            ..ok.clone()
        };
        assert_eq!(zero.check(512), Err(GenerationError::NoTokens));
        let long = GenerateParams {
            max_tokens: 512,
            ..ok.clone()
        };
        assert_eq!(
            long.check(512),
            Err(GenerationError::BeyondContext {
                max_tokens: 512,
                context_length: 512
            })
        );
        let hot = GenerateParams {
            temperature: f32::NAN,
            ..ok.clone()
        };
        assert!(matches!(
            hot.check(512),
            Err(GenerationError::Temperature(t)) if t.is_nan()
        ));
        let p = GenerateParams { top_p: 0.0, ..ok };
        assert_eq!(p.check(512), Err(GenerationError::TopP(0.0)));
    }
}
