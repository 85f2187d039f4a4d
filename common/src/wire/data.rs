//! Requesters ↔ workers: the data channel. A requester (the SDK, a front
//! door) dials a worker's data address with its own cluster certificate
//! and opens one bidirectional stream per request and worker: a
//! [`DataRequest::Open`] and the request's tensors that worker reads,
//! answered on the same stream by what that worker has for the request —
//! [`DataReply`] reports and the tensor frames of the graph outputs it
//! makes — until it has nothing more (the stream ends). Dropping the
//! stream (the receive side stopped) cancels the request there.
//!
//! Request and sequence ids belong to the certificate that opened them: a
//! worker refuses an `Open` of a request another identity owns, tensors
//! of another request on an `Open`'s stream, a step, an end or a cancel of
//! a sequence or request another identity owns.

use serde::{Deserialize, Serialize};

use super::control::{NodeTime, Transfer};
use super::generate::Steps;
use super::message::{channel, Failure, Reply, Status};

/// What a requester asks a worker, one per stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DataRequest {
    /// A request (one try of it) reaches this worker; `inputs` tensor
    /// frames follow on the stream.
    Open(Open),
    /// Forget a request: drop its waiting inputs, send nothing more.
    Cancel { request: u64 },
    /// A sequence ended: free its state on this worker's stages of
    /// `deployment`.
    EndSequence { deployment: u64, sequence: u64 },
}

channel!(DataRequest, "data request", [Open, Cancel, EndSequence]);

/// One request at one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Open {
    /// The deployment (the network id in its tensor frames).
    pub deployment: u64,
    pub request: u64,
    /// Tensor frames that follow: the graph inputs this worker reads, and
    /// the request's trigger where this worker takes one.
    pub inputs: u32,
    /// Report every tensor that arrives here (`Moved`) and per-node times,
    /// besides each subgraph run's time.
    pub counters: bool,
    /// The sequence steps the request is (absent: stateless).
    pub sequence: Option<Steps>,
    /// Sampling, one per row of `sequence`: the worker that makes the
    /// logits answers the rows' next tokens ([`DataReply::Sampled`])
    /// instead of the logits. Empty: the logits come back.
    pub sampling: Vec<Sampling>,
}

/// How one row's next token is drawn from its logits (at the last
/// position): greedy at temperature 0, else from the softmax at that
/// temperature over the `top_k` most likely (0: all) whose probabilities
/// sum to `top_p`. The draw depends only on (`seed`, `index`), so a
/// replayed step draws the same token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub seed: u64,
    /// The token's index in the generation (0: the first generated).
    pub index: u32,
    /// Also answer the log-probability of the drawn token and of the
    /// `logprobs` most likely ones (0: none).
    pub logprobs: u32,
}

/// A row's drawn token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampledToken {
    pub id: u32,
    /// Its log-probability under the model (with `logprobs` asked).
    pub logprob: Option<f32>,
    /// The most likely tokens and their log-probabilities, best first
    /// (`logprobs` of them).
    pub top: Vec<(u32, f32)>,
}

/// What a worker answers on a requester's stream (besides the tensor
/// frames of the graph outputs it makes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DataReply {
    /// One of its subgraphs ran the request.
    Ran {
        subgraph: u32,
        micros: u64,
        nodes: Vec<NodeTime>,
    },
    /// A tensor of the request arrived here (with `counters`).
    Moved(Transfer),
    /// The next token of each row of a sampled step, in row order (in
    /// place of its logits).
    Sampled(Vec<SampledToken>),
    /// A tensor of the request could not reach the worker that reads it.
    Unreachable { error: String },
    /// The request failed here (or was refused).
    Failed(Failure),
    /// Its subgraphs hold as many requests as their mailboxes take, or a
    /// fresh sequence found no room and no place in the queue: try again
    /// in about `retry_after_ms`, or elsewhere.
    Busy { retry_after_ms: u64, reason: String },
    /// A `Cancel` or `EndSequence` done.
    Done,
}

channel!(
    DataReply,
    "data reply",
    [Ran, Moved, Sampled, Unreachable, Failed, Busy, Done]
);

impl Reply for DataReply {
    fn status(self) -> Status<DataReply> {
        match self {
            DataReply::Failed(f) => Status::Failed(f),
            answer => Status::Answer(answer),
        }
    }

    fn failed(failure: Failure) -> DataReply {
        DataReply::Failed(failure)
    }
}
