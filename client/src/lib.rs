//! `tessera-client`: the Rust SDK for a Tessera cluster.
//!
//! [`Client::connect`] dials the coordinator (QUIC, mutual TLS with a
//! certificate from the cluster CA); [`Client::load_network`] ships an ONNX
//! model, which the coordinator plans over the cluster's devices and
//! deploys, and returns a [`Network`] with its [`Plan`]. [`Network::infer`]
//! runs one request; [`Network::infer_many`] submits many at once
//! (pipelined through the workers) and returns their results in order.
//! Tensors convert from and to `ndarray` ([`tensor`]). Errors are a
//! [`ClientError`].
//!
//! The client is a requester: the coordinator only loads and plans, and
//! publishes each network's routing table ([`routes`]); requests go from
//! the client straight to the workers of the copy it picks, and their
//! outputs come straight back ([`infer`]), with the same certificate. The
//! client retries on another copy when a worker is lost. Requests and
//! generations go on while the coordinator is away (the last table stays);
//! the client dials it again when it comes back.
//!
//! Layout: `connection` (the [`Client`]: dialling the leader, and again
//! when the connection closed), `control` (the coordinator's control
//! calls: loads, named models, plans, queries, the cluster's state),
//! `network` (the [`Network`] handle and its requests), `options`
//! ([`LoadOptions`]), [`routes`] (routing-table subscription, picking a
//! copy), [`infer`] (the request path), [`peers`] (connections to
//! workers), [`generate`] (model folders and text generation: tokenizer,
//! batching, the generation loop), [`plan`] (the plan a load returns),
//! [`tensor`] (ndarray conversions).
//!
//! A runnable example against an embedded local cluster:
//! `cargo run --example sdk -p tessera-cli` (`cli/examples/sdk.rs`).
//!
//! # Example
//!
//! ```no_run
//! use tessera_client::{tensor, Client, LoadOptions};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let identity = tessera_net::certs::load_identity("certs".as_ref(), "client")?;
//! let client = Client::connect("127.0.0.1:7400".parse()?, &identity, "lab").await?;
//! let network = client
//!     .load_network(std::fs::read("model.onnx")?, LoadOptions::devices("HETERO:node-a/CPU,node-b/CPU"))
//!     .await?;
//! for sg in &network.plan().subgraphs {
//!     println!("subgraph {} on {}: {} nodes", sg.id, sg.device, sg.nodes.len());
//! }
//! let x = ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[1, 3, 32, 32]));
//! let outputs = network.infer(vec![("x".into(), tensor::from_array(&x)?)]).await?;
//! let y: ndarray::ArrayD<f32> = tensor::to_array(&outputs.tensors[0].1)?;
//! network.unload().await?;
//! # Ok(()) }
//! ```

mod connection;
mod control;
pub mod embed;
mod error;
pub mod generate;
pub mod infer;
pub mod leader;
mod network;
mod options;
pub mod peers;
pub mod plan;
pub mod routes;
pub mod tensor;

pub use tessera_common::affinity::Policy;
pub use tessera_common::wire::control::LoadRequest;
pub use tessera_common::wire::control::{
    Batching, Counters, DeviceAnswer, ModelState, ModelStatus, NodeTime, Replicas, Transfer,
    WorkerState,
};

pub use connection::Client;
pub use control::ClusterState;
pub use error::{ClientError, Operation};
pub use network::{Network, Outputs, DEFAULT_DEADLINE};
pub use options::{LoadOptions, KNOWN_ABOVE};
pub use plan::Plan;
pub use tessera_common::wire::control::ErrorKind;
