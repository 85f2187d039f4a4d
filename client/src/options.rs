//! How to load a network ([`LoadOptions`]), and the load message and
//! payload they make.

use std::time::Duration;

use bytes::Bytes;
use tessera_common::affinity::Policy;
use tessera_common::wire::control::{Batching, LoadRequest, Replicas};

use crate::generate;

/// How to load a network.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// A name for logs.
    pub name: String,
    /// Device priority, e.g. `HETERO:node-a/GPU,node-b/CPU`; a bare kind
    /// (`CPU`) means that kind on every worker; empty: every device.
    pub devices: String,
    /// `Priority` (first device in the list that supports a node) or
    /// `Cost` (cheapest by the workers' metrics and measured links).
    pub policy: Policy,
    /// Fail instead of falling back when a node's device cannot run it.
    pub strict: bool,
    /// Manual affinity: node name → device (`node-b/CPU`).
    pub affinity: Vec<(String, String)>,
    /// Concrete shapes of graph inputs (`--shape NAME=1,3,640,640`): the
    /// network is simplified for them (shape computations folded) and
    /// takes only inputs of these shapes. Empty: dynamic dims stay.
    pub shapes: Vec<(String, Vec<usize>)>,
    /// Copies of the network (`Count(1)` by default; `Auto`: as many, and
    /// as split, as the cost model predicts gives the most throughput);
    /// requests go to the copy with the least outstanding work.
    pub replicas: Replicas,
    /// Dynamic batching (off by default): requests waiting for a subgraph
    /// run as one batch along the first dimension, which must be dynamic.
    pub batching: Option<Batching>,
    /// A generative network's tokenizer and limits
    /// ([`generate::ModelFolder`]); it then answers
    /// [`Network::generate`](crate::Network::generate).
    pub generation: Option<generate::GenerationSpec>,
    /// An embedding model (`/v1/embeddings`,
    /// [`Network::embed`](crate::Network::embed)): its tokenizer
    /// (`tokenizer_json`) and pooling.
    pub embedding: Option<tessera_common::wire::embed::EmbeddingSpec>,
    /// The model's SHA-256 (hex) where the caller knows it (remembered
    /// by its files, say): a load of [`KNOWN_ABOVE`] bytes or more first
    /// asks whether the coordinator has them, and hashes them when this is
    /// `None`.
    pub model_sha256: Option<String>,
}

/// Models of this many bytes or more are named by their SHA-256 before
/// they are sent: a coordinator that has them (loaded before) is sent
/// nothing.
pub const KNOWN_ABOVE: usize = 16 << 20;

impl LoadOptions {
    /// Options with a device priority and the defaults otherwise.
    pub fn devices(devices: &str) -> LoadOptions {
        LoadOptions {
            devices: devices.into(),
            ..Default::default()
        }
    }

    /// These options with `replicas` copies.
    pub fn replicas(mut self, replicas: Replicas) -> LoadOptions {
        self.replicas = replicas;
        self
    }

    /// These options with dynamic batching of up to `max_batch` requests,
    /// each waiting at most `max_queue_delay` for others.
    pub fn batching(mut self, max_batch: u32, max_queue_delay: Duration) -> LoadOptions {
        self.batching = Some(Batching {
            max_batch,
            max_queue_delay_us: max_queue_delay.as_micros() as u64,
        });
        self
    }
}

/// A load's message and payload: the model, and a generative or embedding
/// network's tokenizer after it.
pub(crate) fn load_message(
    options: LoadOptions,
    model: Bytes,
    dry_run: bool,
) -> (LoadRequest, Bytes) {
    let mut request = load_request(options, dry_run);
    let payload = match (request.generation.as_mut(), request.embedding.as_mut()) {
        (Some(generation), _) => generation.join_payload(&model),
        (None, Some(embedding)) => embedding.join_payload(&model),
        (None, None) => model,
    };
    (request, payload)
}

fn load_request(options: LoadOptions, dry_run: bool) -> LoadRequest {
    LoadRequest {
        name: options.name,
        devices: options.devices,
        policy: options.policy,
        strict: options.strict,
        affinity: options.affinity,
        dry_run,
        shapes: options
            .shapes
            .into_iter()
            .map(|(name, dims)| (name, dims.into_iter().map(|d| d as u64).collect()))
            .collect(),
        replicas: options.replicas,
        batching: options.batching,
        generation: options.generation,
        embedding: options.embedding,
    }
}
