//! The data channel between requesters and workers, on real processes:
//! requests and sequences belong to the certificate that opened them. A
//! second client certificate cannot open a request the first holds, send a
//! tensor into it, cancel it, step a sequence the first started (which
//! would read its state) or end it; the first can, and its requests go on.

use crate::util;

use std::time::Duration;

use tessera_client::LoadOptions;
use tessera_common::graph::Graph;
use tessera_common::onnx::encode_model;
use tessera_common::synth;
use tessera_common::tensor::Tensor;
use tessera_common::wire::control::ErrorKind;
use tessera_common::wire::data::{DataReply, DataRequest, Open};
use tessera_common::wire::generate::{SequenceStep, Steps};
use tessera_common::wire::handshake::Role;
use tessera_common::wire::tensor::TensorHeader;
use tessera_common::wire::{Frame, Limits};
use tessera_net::{exchange, recv_frame, send_frame, ExchangeError, Node};
use util::cluster::{certs_init, Cluster, CLUSTER};
use util::runtime;

/// A requester's raw connection to a worker's data address.
struct Raw {
    _node: Node,
    connection: quinn::Connection,
    limits: Limits,
}

impl Raw {
    async fn dial(certs: &std::path::Path, name: &str, worker: &str) -> Raw {
        let identity = tessera_net::certs::load_identity(certs, name).unwrap();
        let node = Node::bind(
            "127.0.0.1:0".parse().unwrap(),
            &identity,
            CLUSTER,
            Role::Client,
        )
        .unwrap();
        let peer = node.dial(worker.parse().unwrap()).await.unwrap();
        assert_eq!(peer.hello.role, Role::Worker);
        Raw {
            limits: *node.limits(),
            connection: peer.connection,
            _node: node,
        }
    }

    /// Opens a request with `tensors` on a stream of its own; the stream
    /// stays open (its replies unread) while the returned halves live.
    async fn open(
        &self,
        open: Open,
        tensors: &[(u64, &str, Tensor)],
    ) -> (quinn::SendStream, quinn::RecvStream) {
        let (mut send, recv) = exchange::open(&self.connection).await.unwrap();
        let msg = DataRequest::Open(Open {
            inputs: tensors.len() as u32,
            ..open
        });
        exchange::send_message(&mut send, &msg, None, &self.limits)
            .await
            .unwrap();
        for (request, name, t) in tensors {
            let head = TensorHeader::new(msg_deployment(&msg), *request, name, t)
                .encode(&self.limits)
                .unwrap();
            send_frame(&mut send, &head, Some(&t.shared_bytes()))
                .await
                .unwrap();
        }
        (send, recv)
    }

    /// The first failure a request's stream answers (within 10 s).
    async fn refusal(&self, recv: &mut quinn::RecvStream) -> (ErrorKind, String) {
        let read = async {
            loop {
                match recv_frame::<DataReply>(recv, &self.limits).await {
                    Ok(Some(Frame::Control(DataReply::Failed(f), _))) => return (f.kind, f.error),
                    Ok(Some(_)) => continue,
                    other => panic!("no refusal: {other:?}"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("an answer")
    }

    /// A one-message operation (`Cancel`, `EndSequence`): its answer.
    async fn ask(&self, msg: DataRequest) -> Result<DataReply, ExchangeError> {
        exchange::request(&self.connection, &msg, None, &self.limits, |_| {}).await
    }
}

fn msg_deployment(msg: &DataRequest) -> u64 {
    match msg {
        DataRequest::Open(o) => o.deployment,
        _ => 0,
    }
}

fn open(deployment: u64, request: u64, sequence: Option<(u64, bool)>) -> Open {
    Open {
        deployment,
        request,
        inputs: 0,
        counters: false,
        sequence: sequence.map(|(id, fresh)| {
            Steps::one(SequenceStep {
                id,
                step: if fresh { 1 } else { 2 },
                fresh,
                past: if fresh { 0 } else { 3 },
            })
        }),
        sampling: Vec::new(),
    }
}

fn refused(result: Result<DataReply, ExchangeError>, what: &str) -> String {
    match result {
        Err(ExchangeError::Failed {
            kind: ErrorKind::Refused,
            error,
        }) => error,
        other => panic!("{what} was not refused: {other:?}"),
    }
}

#[test]
fn a_second_certificate_cannot_inject_read_or_cancel_anothers_requests() {
    let cluster = Cluster::start("data-channel", &["node-a"], 1);
    certs_init(&cluster.certs, CLUSTER, &["client-intruder"]);
    let model = synth::small_cnn(7);
    let graph = Graph::from_model(model.clone()).unwrap();
    let inputs = synth::random_inputs(&graph, 2).unwrap();
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let network = client
            .load_network(encode_model(&model), LoadOptions::devices("CPU"))
            .await
            .unwrap();
        let table = network.routes().expect("a routing table");
        let deployment = table.copies[0].deployment.clone().expect("deployed");
        let worker = deployment.hosts[0].data_addr.clone();
        let owner = Raw::dial(&cluster.certs, "client", &worker).await;
        let intruder = Raw::dial(&cluster.certs, "client-intruder", &worker).await;
        let d = deployment.id;

        // The owner's request 42 waits for its input; its sequence 77 is
        // started (both held by the owner's certificate).
        let _held = owner.open(open(d, 42, None), &[]).await;
        let _started = owner.open(open(d, 50, Some((77, true))), &[]).await;
        tokio::time::sleep(Duration::from_millis(200)).await;

        // Opening the owner's request is refused.
        let (_s, mut r) = intruder.open(open(d, 42, None), &[]).await;
        let (kind, why) = intruder.refusal(&mut r).await;
        assert_eq!(kind, ErrorKind::Refused, "{why}");
        assert!(why.contains("belongs to another requester"), "{why}");
        // A tensor of the owner's request on the intruder's own stream.
        let x = inputs[0].1.clone();
        let (_s, mut r) = intruder.open(open(d, 43, None), &[(42, "image", x)]).await;
        let (kind, why) = intruder.refusal(&mut r).await;
        assert_eq!(kind, ErrorKind::Refused, "{why}");
        assert!(why.contains("tensor of request 42"), "{why}");
        // Cancelling it.
        let why = refused(
            intruder.ask(DataRequest::Cancel { request: 42 }).await,
            "a cancel",
        );
        assert!(why.contains("belongs to another requester"), "{why}");
        // A later step of the owner's sequence (it would read its state).
        let (_s, mut r) = intruder.open(open(d, 51, Some((77, false))), &[]).await;
        let (kind, why) = intruder.refusal(&mut r).await;
        assert_eq!(kind, ErrorKind::Refused, "{why}");
        assert!(
            why.contains("sequence 77 belongs to another requester"),
            "{why}"
        );
        // Ending the owner's sequence.
        let end = DataRequest::EndSequence {
            deployment: d,
            sequence: 77,
        };
        let why = refused(intruder.ask(end.clone()).await, "an end");
        assert!(why.contains("sequence 77"), "{why}");

        // The owner may do each of these.
        assert_eq!(
            owner
                .ask(DataRequest::Cancel { request: 42 })
                .await
                .unwrap(),
            DataReply::Done
        );
        assert_eq!(owner.ask(end).await.unwrap(), DataReply::Done);
        // And the owner's requests go on.
        let got = network.infer(inputs.clone()).await.unwrap();
        assert_eq!(got.tensors.len(), 1);
        println!(
            "the intruder's open, tensor, cancel, step and end were refused; the owner's were not"
        );
    });
}
