//! A real cluster refuses what it must, with clear errors, and serves on:
//! a worker with a certificate from another CA, another node's certificate
//! (a client's claiming a worker's name, a worker's used by a client), a
//! client without a
//! certificate, a peer of another protocol version, a garbled frame, an
//! oversized message, unknown devices, inputs of the wrong shape.

use crate::util;

use std::net::SocketAddr;

use tessera_client::{ClientError, ErrorKind, LoadOptions, Operation};
use tessera_common::graph::Graph;
use tessera_common::onnx::encode_model;
use tessera_common::synth;
use tessera_common::tensor::Tensor;
use tessera_common::wire::client::ClientReply;
use tessera_common::wire::frame::FrameKind;
use tessera_common::wire::handshake::Role;
use tessera_common::wire::{Frame, Prefix, PROTOCOL_VERSION};
use tessera_net::{certs, recv_frame, tls, Node};
use util::cluster::{certs_init, Cluster, CLUSTER};
use util::oracle::{max_abs_diff, onnxruntime};

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Writes `bytes` on a new stream of a proper client connection and
/// returns the coordinator's answer (a `Failed` message's error).
async fn answer_to(cluster: &Cluster, bytes: &[u8]) -> String {
    let id = certs::load_identity(&cluster.certs, "client").unwrap();
    let node = Node::bind(any(), &id, CLUSTER, Role::Client).unwrap();
    let peer = node.dial(cluster.addr).await.unwrap();
    let (mut send, mut recv) = peer.connection.open_bi().await.unwrap();
    send.write_all(bytes).await.unwrap();
    let _ = send.finish();
    match recv_frame::<ClientReply>(&mut recv, node.limits()).await {
        Ok(Some(Frame::Control(ClientReply::Failed(failure), _))) => failure.error,
        other => panic!("expected a Failed answer, got {other:?}"),
    }
}

#[test]
fn bad_peers_and_bad_messages_are_refused_and_the_cluster_serves_on() {
    let cluster = Cluster::start("refusals", &["node-a", "node-b"], 1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // A worker whose certificate comes from another CA: it exits with an
    // error; the coordinator logs the refusal.
    let foreign = cluster.dir.join("foreign-certs");
    certs_init(&foreign, CLUSTER, &["node-x"]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_worker"))
        .args(cluster.worker_args("node-x", &foreign, 1))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // Refused in the TLS handshake: not retried, whatever `reconnect` says.
    assert!(
        stderr.contains("error:")
            && stderr.contains("TLS handshake")
            && stderr.contains("certificate"),
        "{stderr}"
    );
    println!("foreign worker: {}", stderr.trim());

    // The client's certificate presented as worker node-a: refused (it
    // cannot evict the real node-a), and the worker exits with why.
    let impostor = cluster.dir.join("impostor-certs");
    std::fs::create_dir_all(&impostor).unwrap();
    for (from, to) in [
        ("ca.pem", "ca.pem"),
        ("client.pem", "node-a.pem"),
        ("client.key", "node-a.key"),
    ] {
        std::fs::copy(cluster.certs.join(from), impostor.join(to)).unwrap();
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_worker"))
        .args(cluster.worker_args("node-a", &impostor, 1))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("claiming to be the worker 'node-a'")
            && stderr.contains("certificate of the client 'client'"),
        "{stderr}"
    );
    println!("client certificate as node-a: {}", stderr.trim());
    // A worker's certificate used by a client.
    let client = cluster.client_args();
    let mut args: Vec<&str> = vec!["cluster"];
    args.extend(client.iter().map(String::as_str));
    let (ok, _, err) = util::tessera(&[args.as_slice(), &["--name", "node-b"]].concat());
    assert!(
        !ok && err.contains("claiming to be the client 'node-b'"),
        "{err}"
    );
    let (ok, out, err) = util::tessera(&args);
    assert!(
        ok && out.starts_with("2 workers"),
        "node-a still serves: {out}{err}"
    );

    rt.block_on(async {
        // A client without any certificate.
        let id = certs::load_identity(&cluster.certs, "client").unwrap();
        let bare = Node::bind(any(), &id, CLUSTER, Role::Client)
            .unwrap()
            .with_client_config(tls::client_config_without_certificate(&id.ca_pem).unwrap());
        let err = bare.dial(cluster.addr).await.expect_err("no certificate");
        println!("client without a certificate: {err}");

        // Another protocol version.
        let mut old = Node::bind(any(), &id, CLUSTER, Role::Client).unwrap();
        old.hello_mut().protocol = PROTOCOL_VERSION + 1;
        let err = old.dial(cluster.addr).await.expect_err("another version");
        assert!(err.to_string().contains("protocol version"), "{err}");

        // Garbage, then a frame announcing a payload over the limit.
        let error = answer_to(&cluster, b"GET / HTTP/1.1\r\n\r\n").await;
        assert!(error.contains("not a Tessera frame"), "{error}");
        let huge = Prefix {
            kind: FrameKind::Control,
            header_len: 8,
            payload_len: 1 << 40,
            shared: false,
        };
        let error = answer_to(&cluster, &huge.encode()).await;
        assert!(error.contains("exceeds the limit"), "{error}");

        // Unknown devices, inputs of the wrong shape.
        let client = cluster.client().await;
        let model = synth::small_cnn(7);
        let bytes = encode_model(&model);
        let err = client
            .load_network(bytes.clone(), LoadOptions::devices("HETERO:node-z/CPU"))
            .await
            .err()
            .expect("an unknown device");
        assert!(
            matches!(
                err,
                ClientError::Failed {
                    op: Operation::Load,
                    kind: ErrorKind::BadInput,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("node-a/CPU") && err.to_string().contains("node-b/CPU"),
            "the error lists the cluster's devices: {err}"
        );
        let network = client
            .load_network(bytes, LoadOptions::devices("CPU"))
            .await
            .unwrap();
        let wrong = Tensor::from_values(vec![1, 3, 32, 32], &vec![0f32; 3 * 32 * 32]).unwrap();
        let err = network
            .infer(vec![("image".into(), wrong)])
            .await
            .expect_err("a wrong shape");
        assert!(err.to_string().contains("must have shape"), "{err}");
        assert_eq!(err.kind(), ErrorKind::BadInput, "{err}");

        // It still serves, correctly.
        let graph = Graph::from_model(model.clone()).unwrap();
        let inputs = synth::random_inputs(&graph, 3).unwrap();
        let path = cluster.dir.join("small_cnn.onnx");
        std::fs::write(&path, encode_model(&model)).unwrap();
        let want = onnxruntime(&path, &inputs, &cluster.dir.join("ort"));
        let got = network.infer(inputs).await.unwrap();
        assert!(max_abs_diff(&got.tensors[0].1, &want[0]) <= 1e-4);
    });
    let log = cluster.coordinator.log_text();
    assert!(
        log.contains("refused"),
        "the coordinator logged refusals:\n{log}"
    );
}
