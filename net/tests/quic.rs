//! QUIC with mutual TLS on loopback: framed streams, and every way a peer
//! is refused, with the listener serving on afterwards.

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tessera_common::tensor::Tensor;
use tessera_common::wire::cluster::{ToWorker, WorkerReport};
use tessera_common::wire::handshake::Role;
use tessera_common::wire::peer::PeerMessage;
use tessera_common::wire::tensor::TensorHeader;
use tessera_common::wire::Message;
use tessera_common::wire::{Frame, Limits, PROTOCOL_VERSION};
use tessera_net::certs::{self, ClusterCa};
use tessera_net::{recv_frame, send_frame, tls, NetError, Node, Peer};
use tokio::sync::mpsc;

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

/// A coordinator that accepts workers and reports each accepted peer or
/// refusal.
fn serve(node: Arc<Node>) -> mpsc::UnboundedReceiver<Result<Peer, NetError>> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(r) = node.accept(&[Role::Worker, Role::Client]).await {
            if tx.send(r).is_err() {
                break;
            }
        }
    });
    rx
}

/// A node of cluster `lab` whose certificate names `name` as `cert_role`,
/// speaking as `role`.
fn bound(ca: &ClusterCa, name: &str, cert_role: Role, role: Role) -> Node {
    Node::bind(any(), &ca.issue(name, cert_role).unwrap(), "lab", role).unwrap()
}

/// A coordinator node of cluster `lab`, shared with its accept loop.
fn coordinator(ca: &ClusterCa) -> Arc<Node> {
    let id = ca.issue("coordinator", Role::Coordinator).unwrap();
    Arc::new(Node::bind(any(), &id, "lab", Role::Coordinator).unwrap())
}

/// A coordinator and a worker of cluster `lab`, connected: (coordinator,
/// worker, the worker's side, the coordinator's side).
async fn connected() -> (Arc<Node>, Node, Peer, Peer) {
    connected_with(true).await
}

/// [`connected`], its payloads through shared memory or not (`shared`).
async fn connected_with(shared: bool) -> (Arc<Node>, Node, Peer, Peer) {
    let ca = ClusterCa::generate("lab").unwrap();
    let coordinator = coordinator(&ca);
    let mut accepted = serve(coordinator.clone());
    let worker = Node::bind(
        any(),
        &ca.issue("node-a", Role::Worker).unwrap(),
        "lab",
        Role::Worker,
    )
    .unwrap();
    let worker = if shared {
        worker
    } else {
        worker.without_shared_memory()
    };
    let addr = coordinator.local_addr().unwrap();
    let peer = worker.dial(addr).await.unwrap();
    let theirs = accepted.recv().await.unwrap().unwrap();
    (coordinator, worker, peer, theirs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_carries_control_and_tensor_frames() {
    let (_coordinator, worker, mut peer, mut theirs) = connected().await;
    assert_eq!(peer.hello.node, "coordinator");
    assert_eq!(
        (theirs.hello.node.as_str(), theirs.hello.role),
        ("node-a", Role::Worker)
    );

    // 8 MB tensor and a control message with a payload, on the control stream.
    let values: Vec<f32> = (0..2_000_000).map(|i| i as f32).collect();
    let t = Tensor::from_values(vec![2, 1_000_000], &values).unwrap();
    let limits = *worker.limits();
    let model = Bytes::from(vec![3u8; 4096]);
    let query = ToWorker::QueryNetwork {
        devices: vec!["CPU".into()],
        epoch: 1,
    };
    // Sender and receiver run together: QUIC flow control holds the sender
    // until the receiver reads.
    let sending = async {
        send_frame(
            &mut peer.send,
            &query.encode(4096, &limits).unwrap(),
            Some(&model),
        )
        .await
        .unwrap();
        let head = TensorHeader::new(1, 2, "x", &t).encode(&limits).unwrap();
        send_frame(&mut peer.send, &head, Some(&t.shared_bytes()))
            .await
            .unwrap();
        peer.send.finish().unwrap();
    };
    let receiving = async {
        let mut frames = Vec::new();
        while let Some(frame) = recv_frame::<ToWorker>(&mut theirs.recv, &limits)
            .await
            .unwrap()
        {
            frames.push(frame);
        }
        frames
    };
    let ((), frames) = tokio::join!(sending, receiving);
    assert_eq!(frames.len(), 2);
    assert_eq!(frames[0], Frame::Control(query, model));
    let Frame::Tensor(h, payload) = frames[1].clone() else {
        panic!("a tensor frame")
    };
    assert_eq!(h.into_tensor(payload).unwrap(), t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_outside_the_cluster_are_refused_and_the_listener_serves_on() {
    let ca = ClusterCa::generate("lab").unwrap();
    let coordinator = coordinator(&ca);
    let addr = coordinator.local_addr().unwrap();
    let mut accepted = serve(coordinator.clone());

    // A certificate from another CA.
    let stranger = ClusterCa::generate("lab")
        .unwrap()
        .issue("node-x", Role::Worker)
        .unwrap();
    let mut id = stranger.clone();
    id.ca_pem = ca.cert_pem.clone(); // it trusts our CA, but we do not trust it
    let node = Node::bind(any(), &id, "lab", Role::Worker).unwrap();
    let err = node.dial(addr).await.expect_err("a foreign certificate");
    assert!(matches!(err, NetError::TlsRefused { .. }), "{err}");
    assert!(accepted.recv().await.unwrap().is_err());

    // No certificate at all.
    let bare = Node::bind(
        any(),
        &ca.issue("node-y", Role::Client).unwrap(),
        "lab",
        Role::Client,
    )
    .unwrap()
    .with_client_config(tls::client_config_without_certificate(&ca.cert_pem).unwrap());
    let err = bare.dial(addr).await.expect_err("no certificate");
    assert!(matches!(err, NetError::TlsRefused { .. }), "{err}");
    assert!(accepted.recv().await.unwrap().is_err());

    // Another protocol version, another cluster, a role not accepted.
    let mut old = Node::bind(
        any(),
        &ca.issue("node-z", Role::Worker).unwrap(),
        "lab",
        Role::Worker,
    )
    .unwrap();
    old.hello_mut().protocol = PROTOCOL_VERSION + 1;
    let err = old.dial(addr).await.expect_err("another version");
    let text = err.to_string();
    assert!(
        text.contains("refused us") && text.contains("protocol version"),
        "{text}"
    );
    assert!(accepted.recv().await.unwrap().is_err());
    let other = Node::bind(
        any(),
        &ca.issue("node-w", Role::Worker).unwrap(),
        "prod",
        Role::Worker,
    )
    .unwrap();
    let err = other.dial(addr).await.expect_err("another cluster");
    assert!(err.to_string().contains("cluster 'prod'"), "{err}");
    assert!(accepted.recv().await.unwrap().is_err());
    let rival = Node::bind(
        any(),
        &ca.issue("coord-2", Role::Coordinator).unwrap(),
        "lab",
        Role::Coordinator,
    )
    .unwrap();
    let err = rival
        .dial(addr)
        .await
        .expect_err("a coordinator may not dial one");
    assert!(err.to_string().contains("may not connect"), "{err}");
    assert!(accepted.recv().await.unwrap().is_err());

    // A proper worker still gets in.
    let good = Node::bind(
        any(),
        &ca.issue("node-a", Role::Worker).unwrap(),
        "lab",
        Role::Worker,
    )
    .unwrap();
    good.dial(addr).await.unwrap();
    assert_eq!(accepted.recv().await.unwrap().unwrap().hello.node, "node-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_cannot_pass_for_another_node_or_role() {
    let ca = ClusterCa::generate("lab").unwrap();
    let coordinator = coordinator(&ca);
    let addr = coordinator.local_addr().unwrap();
    let mut accepted = serve(coordinator.clone());

    // The client's certificate claiming to be worker node-a.
    let mut impostor = bound(&ca, "client", Role::Client, Role::Worker);
    impostor.hello_mut().node = "node-a".into();
    let err = impostor
        .dial(addr)
        .await
        .expect_err("a client posing as a worker");
    let text = err.to_string();
    assert!(
        text.contains("claiming to be the worker 'node-a'")
            && text.contains("certificate of the client 'client'"),
        "{text}"
    );
    assert!(accepted.recv().await.unwrap().is_err());

    // One worker's certificate claiming another worker's name.
    let mut other = bound(&ca, "node-b", Role::Worker, Role::Worker);
    other.hello_mut().node = "node-a".into();
    let err = other.dial(addr).await.expect_err("node-b posing as node-a");
    assert!(err.to_string().contains("the worker 'node-b'"), "{err}");
    assert!(accepted.recv().await.unwrap().is_err());

    // A worker's certificate used as a client.
    let as_client = bound(&ca, "node-b", Role::Worker, Role::Client);
    let err = as_client
        .dial(addr)
        .await
        .expect_err("a worker posing as a client");
    assert!(
        err.to_string()
            .contains("claiming to be the client 'node-b'"),
        "{err}"
    );
    assert!(accepted.recv().await.unwrap().is_err());

    // A listener that lies about its name is refused by the dialer.
    let mut liar = bound(&ca, "coordinator", Role::Coordinator, Role::Coordinator);
    liar.hello_mut().node = "coordinator-2".into();
    let liar = Arc::new(liar);
    let liar_addr = liar.local_addr().unwrap();
    let _liar_accepts = serve(liar.clone());
    let worker = bound(&ca, "node-a", Role::Worker, Role::Worker);
    let err = worker.dial(liar_addr).await.expect_err("a lying listener");
    assert!(
        err.to_string().contains("the coordinator 'coordinator-2'"),
        "{err}"
    );

    // The real node-a still gets in.
    worker.dial(addr).await.unwrap();
    let peer = accepted.recv().await.unwrap().unwrap();
    assert_eq!(
        (peer.hello.node.as_str(), peer.hello.role),
        ("node-a", Role::Worker)
    );
}

#[test]
fn certs_init_names_roles_from_node_names_or_explicitly() {
    use tessera_net::certs::parse_node;
    let role = |spec: &str| parse_node(spec).unwrap();
    assert_eq!(
        role("coordinator"),
        ("coordinator".into(), Role::Coordinator)
    );
    assert_eq!(role("client"), ("client".into(), Role::Client));
    assert_eq!(role("client-ops"), ("client-ops".into(), Role::Client));
    assert_eq!(role("node-a"), ("node-a".into(), Role::Worker));
    assert_eq!(role("ops:client"), ("ops".into(), Role::Client));
    assert_eq!(role("gpu-box:worker"), ("gpu-box".into(), Role::Worker));
    assert!(parse_node("x:admin")
        .unwrap_err()
        .to_string()
        .contains("role"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbled_stream_fails_alone() {
    let (_coordinator, worker, mut peer, mut theirs) = connected().await;
    let limits = *worker.limits();

    // A second stream carrying garbage, then a frame claiming 1 TB.
    let (mut send, _recv) = peer.connection.open_bi().await.unwrap();
    send.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    send.finish().unwrap();
    let (_s, mut recv) = theirs.connection.accept_bi().await.unwrap();
    let err = recv_frame::<WorkerReport>(&mut recv, &limits)
        .await
        .expect_err("garbage");
    assert!(err.to_string().contains("not a Tessera frame"), "{err}");
    let (mut send, _recv) = peer.connection.open_bi().await.unwrap();
    let mut huge = WorkerReport::Heartbeat {
        seq: 1,
        in_flight: 0,
        subgraphs: vec![],
        sequences: vec![],
        links: vec![],
        rss_bytes: 0,
        compiles: Default::default(),
    }
    .encode(0, &limits)
    .unwrap();
    huge[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    send.write_all(&huge).await.unwrap();
    let (_s, mut recv) = theirs.connection.accept_bi().await.unwrap();
    let err = recv_frame::<WorkerReport>(&mut recv, &limits)
        .await
        .expect_err("oversized");
    assert!(err.to_string().contains("exceeds the limit"), "{err}");

    // The control stream still works.
    let beat = WorkerReport::Heartbeat {
        seq: 7,
        in_flight: 0,
        subgraphs: vec![],
        sequences: vec![],
        links: vec![],
        rss_bytes: 0,
        compiles: Default::default(),
    };
    send_frame(&mut peer.send, &beat.encode(0, &limits).unwrap(), None)
        .await
        .unwrap();
    let got = recv_frame::<WorkerReport>(&mut theirs.recv, &limits)
        .await
        .unwrap();
    assert_eq!(got, Some(Frame::Control(beat, Bytes::new())));
}

#[test]
fn certs_init_writes_and_reuses_the_cluster_ca() {
    let dir = tempfile::tempdir().unwrap();
    let written = certs::init_dir(dir.path(), "lab", &["coordinator", "node-a"], &[]).unwrap();
    assert_eq!(written.len(), 6);
    // A second run adds a node under the same CA.
    let again = certs::init_dir(dir.path(), "lab", &["node-b"], &[]).unwrap();
    assert_eq!(again.len(), 2);
    let a = certs::load_identity(dir.path(), "node-a").unwrap();
    let b = certs::load_identity(dir.path(), "node-b").unwrap();
    assert_eq!(a.ca_pem, b.ca_pem);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let server = Node::bind(any(), &a, "lab", Role::Worker).unwrap();
        let client = Node::bind(any(), &b, "lab", Role::Worker).unwrap();
        let addr = server.local_addr().unwrap();
        let (accepted, dialed) = tokio::join!(server.accept(&[Role::Worker]), client.dial(addr));
        assert_eq!(accepted.unwrap().unwrap().hello.node, "node-b");
        assert_eq!(dialed.unwrap().hello.node, "node-a");
    });
    assert!(certs::init_dir(dir.path(), "lab", &["bad name"], &[]).is_err());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}

#[test]
fn certs_init_from_a_ca_folder_copies_only_its_certificate() {
    let ca = tempfile::tempdir().unwrap();
    certs::init_dir(ca.path(), "lab", &[], &[]).unwrap();
    let pod = tempfile::tempdir().unwrap();
    let written =
        certs::init_dir_with_ca(pod.path(), Some(ca.path()), "lab", &["node-a"], &[]).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["ca.pem", "node-a.pem", "node-a.key"]);
    assert!(!pod.path().join("ca.key").exists(), "the CA key stays");
    // Signed by that CA: it verifies against the CA folder's certificate.
    let a = certs::load_identity(pod.path(), "node-a").unwrap();
    assert_eq!(
        a.ca_pem,
        std::fs::read_to_string(ca.path().join("ca.pem")).unwrap()
    );
    // Again into the same folder: the same CA is fine; another is refused.
    certs::init_dir_with_ca(pod.path(), Some(ca.path()), "lab", &["node-b"], &[]).unwrap();
    let other = tempfile::tempdir().unwrap();
    certs::init_dir(other.path(), "lab", &[], &[]).unwrap();
    let e = certs::init_dir_with_ca(pod.path(), Some(other.path()), "lab", &["node-c"], &[])
        .unwrap_err();
    assert!(e.to_string().contains("another CA"), "{e}");
    // A folder without a CA is a clear error.
    let empty = tempfile::tempdir().unwrap();
    let e = certs::init_dir_with_ca(pod.path(), Some(empty.path()), "lab", &["node-c"], &[])
        .unwrap_err();
    assert!(e.to_string().contains("ca.pem"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_says_hello_holds_up_no_other() {
    let ca = ClusterCa::generate("lab").unwrap();
    let server = coordinator(&ca);
    // The accept loop the coordinator runs: each connection handshakes on
    // its own task.
    let (tx, mut accepted) = mpsc::unbounded_channel();
    let node = server.clone();
    tokio::spawn(async move {
        while let Some(incoming) = node.incoming().await {
            let (node, tx) = (node.clone(), tx.clone());
            tokio::spawn(async move {
                let _ = tx.send(node.handshake(incoming, &[Role::Worker]).await);
            });
        }
    });
    let addr = server.local_addr().unwrap();

    // A worker with a valid certificate that completes TLS and then says
    // nothing (its keep-alives hold the connection open).
    let silent_id = ca.issue("node-s", Role::Worker).unwrap();
    let mut silent = quinn::Endpoint::client(any()).unwrap();
    silent.set_default_client_config(tls::client_config(&silent_id, tls::Path::of(addr)).unwrap());
    let quiet = silent
        .connect(addr, certs::CLUSTER_SAN)
        .unwrap()
        .await
        .unwrap();

    // Another worker connects after it and is served at once.
    let worker = bound(&ca, "node-a", Role::Worker, Role::Worker);
    let started = std::time::Instant::now();
    let peer = worker.dial(addr).await.unwrap();
    assert_eq!(peer.hello.role, Role::Coordinator);
    let theirs = accepted.recv().await.unwrap().unwrap();
    assert_eq!(theirs.hello.node, "node-a");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));

    // The silent one is dropped once its time for a hello is up.
    let refused = tokio::time::timeout(
        tessera_net::HELLO_TIMEOUT + std::time::Duration::from_secs(5),
        accepted.recv(),
    )
    .await
    .expect("the silent peer's handshake ends")
    .unwrap();
    let Err(err) = refused else {
        panic!("the silent peer was accepted")
    };
    assert!(err.to_string().contains("no hello within"), "{err}");
    drop(quiet);
}

/// The tensor frames `theirs` receives on the streams its peer opens.
fn tensors_arriving(
    theirs: &Peer,
    limits: Limits,
) -> mpsc::UnboundedReceiver<(TensorHeader, Bytes)> {
    let (tx, arrived) = mpsc::unbounded_channel();
    tokio::spawn(tessera_net::serve_streams(
        theirs.connection.clone(),
        limits,
        move |frame: Frame<PeerMessage>, _took| {
            let tx = tx.clone();
            async move {
                if let Frame::Tensor(h, payload) = frame {
                    let _ = tx.send((h, payload));
                }
            }
        },
    ));
    arrived
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_steps_tensors_overtake_a_large_tensor_on_the_same_link() {
    use tessera_common::wire::generate::{SequenceStep, Steps};
    // QUIC's lanes, not shared memory (where the large tensor is not on
    // the stream at all).
    let (_coordinator, worker, peer, theirs) = connected_with(false).await;
    assert!(tessera_net::shared::of(&peer.connection).is_none());
    let limits = *worker.limits();
    let mut arrived = tensors_arriving(&theirs, limits);
    let link = tessera_net::Link::open(peer.connection.clone(), "coordinator", limits, 8);
    // 32 MB of another request, then a decode step's few bytes, then a
    // small tensor of no sequence.
    let big = Tensor::from_values(vec![8_000_000], &vec![1.0f32; 8_000_000]).unwrap();
    let small = Tensor::from_values(vec![1, 1], &[7i64]).unwrap();
    let step = Steps::one(SequenceStep {
        id: 1,
        step: 2,
        fresh: false,
        past: 5,
    });
    link.send_tensor(1, 1, "big", &big).await.unwrap();
    link.send_step_tensor(1, 2, Some(&step), "step", &small)
        .await
        .unwrap();
    link.send_tensor(1, 3, "after", &small).await.unwrap();
    let mut order = Vec::new();
    while order.len() < 3 {
        let (header, _) = tokio::time::timeout(std::time::Duration::from_secs(30), arrived.recv())
            .await
            .expect("frames arrive")
            .expect("a frame");
        order.push(header.name);
    }
    // The step took the express lane; the small tensor of no sequence
    // kept its place behind the large one on the bulk lane.
    assert_eq!(order, ["step", "big", "after"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_host_peers_pass_large_payloads_through_shared_memory() {
    let (_coordinator, worker, peer, theirs) = connected().await;
    let limits = *worker.limits();
    let ours = tessera_net::shared::of(&peer.connection).expect("the worker's side");
    let other = tessera_net::shared::of(&theirs.connection).expect("the coordinator's side");
    // Each side mapped the other's region and removed its name.
    for named in [&peer.hello.shared_memory, &theirs.hello.shared_memory] {
        let name = named.as_deref().expect("a region in the hello");
        assert!(!std::path::Path::new(name).exists(), "{name} left behind");
    }
    let mut arrived = tensors_arriving(&theirs, limits);
    let link = tessera_net::Link::open(peer.connection.clone(), "coordinator", limits, 8);
    // A small tensor (on the stream), 1 MB and 8 MB (shared), 80 MB (more
    // than the region: on the stream), then 1 MB again, 20 times over,
    // each sent once the one before arrived: the region's space is reused.
    let sized = |n: usize| {
        Tensor::from_values(vec![n], &(0..n).map(|i| i as f32).collect::<Vec<_>>()).unwrap()
    };
    let mut sent = vec![
        sized(100),
        sized(250_000),
        sized(2_000_000),
        sized(20_000_000),
    ];
    sent.extend((0..20).map(|_| sized(250_000)));
    for (i, t) in sent.iter().enumerate() {
        link.send_tensor(1, i as u64, "t", t).await.unwrap();
        let (header, payload) =
            tokio::time::timeout(std::time::Duration::from_secs(30), arrived.recv())
                .await
                .expect("frames arrive")
                .expect("a frame");
        assert_eq!(&header.into_tensor(payload).unwrap(), t);
    }
    assert_eq!(ours.bytes_placed(), (21 * 250_000 + 2_000_000) * 4);
    assert_eq!(other.bytes_placed(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensors_that_do_not_fit_a_busy_region_go_on_quic_in_their_order() {
    let (_coordinator, worker, peer, theirs) = connected().await;
    let limits = *worker.limits();
    let mut arrived = tensors_arriving(&theirs, limits);
    let link = tessera_net::Link::open(peer.connection.clone(), "coordinator", limits, 16);
    // Twelve 8 MB tensors at once: more than the 64 MiB region holds while
    // the receiver copies them out.
    let sent: Vec<Tensor> = (0..12)
        .map(|i| Tensor::from_values(vec![2_000_000], &vec![i as f32; 2_000_000]).unwrap())
        .collect();
    for (i, t) in sent.iter().enumerate() {
        link.send_tensor(1, i as u64, "t", t).await.unwrap();
    }
    for (i, t) in sent.iter().enumerate() {
        let (header, payload) =
            tokio::time::timeout(std::time::Duration::from_secs(60), arrived.recv())
                .await
                .expect("frames arrive")
                .expect("a frame");
        assert_eq!(header.request, i as u64, "in the order sent");
        assert_eq!(&header.into_tensor(payload).unwrap(), t);
    }
    let ours = tessera_net::shared::of(&peer.connection).expect("shared memory");
    assert!(ours.bytes_placed() > 0);
}
