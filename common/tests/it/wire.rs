//! The wire protocol: round trips, limits, garbled and truncated input.

use bytes::Bytes;
use proptest::prelude::*;
use tessera_common::tensor::Tensor;
use tessera_common::wire::client::{ClientReply, ClientRequest};
use tessera_common::wire::cluster::{CoordinatorAnswer, ToWorker, WorkerAnswer, WorkerReport};
use tessera_common::wire::control::{
    Batching, CompileCounts, CoordinatorInfo, DeploySpec, Destination, ErrorKind, HeldSubgraph,
    Route, WorkerPhase,
};
use tessera_common::wire::handshake::{self, Handshake, HandshakeError, Hello, Role};
use tessera_common::wire::peer::PeerMessage;
use tessera_common::wire::tensor::TensorHeader;
use tessera_common::wire::{
    chunks, Failure, Frame, FrameDecoder, Limits, Message, Prefix, Progress, WireError,
    PROTOCOL_VERSION,
};

fn decode_all<M: Message>(bytes: &[u8], limits: Limits) -> Result<Vec<Frame<M>>, WireError> {
    let mut d = FrameDecoder::new(limits);
    d.push(bytes)?;
    let mut frames = Vec::new();
    while let Some(f) = d.next_frame()? {
        frames.push(f);
    }
    d.finish()?;
    Ok(frames)
}

#[test]
fn frames_round_trip_whatever_the_read_sizes() {
    let limits = Limits::default();
    let hello = Handshake::Hello(Hello::new("lab", "node-a", Role::Worker));
    let deploy = ToWorker::Deploy {
        epoch: 7,
        spec: Box::new(DeploySpec {
            network: 3,
            subgraph: 1,
            device: "CPU".into(),
            model_hash: "ab".repeat(32),
            model_bytes: 1 << 20,
            pieces: vec![
                tessera_common::wire::pieces::PieceRef::Frame { bytes: 1000 },
                tessera_common::wire::pieces::PieceRef::Weight {
                    sha256: "cd".repeat(32),
                    bytes: (1 << 20) - 1000,
                },
            ],
            inputs: vec!["x".into()],
            outputs: vec![Route {
                tensor: "y".into(),
                to: vec![
                    Destination::Worker {
                        name: "node-b".into(),
                        addr: "127.0.0.1:7001".into(),
                    },
                    Destination::Requester,
                ],
            }],
            batching: Some(Batching {
                max_batch: 8,
                max_queue_delay_us: 500,
            }),
            state: vec![tessera_common::graph::StatePair {
                present: "present.0.key".into(),
                past: "past_key_values.0.key".into(),
                axis: Some(2),
                pads_right: true,
            }],
            max_sequences: 4,
            max_queued: 16,
            queue_timeout_ms: 30_000,
            source: Some("/models/rec.onnx".into()),
        }),
    };
    let model = Bytes::from(vec![7u8; 1000]);
    let t = Tensor::from_values(vec![3, 1000], &vec![0.5f32; 3000]).unwrap();
    let mut stream = hello.encode(&limits).unwrap();
    stream.extend(deploy.encode_with(&model, &limits).unwrap());
    let row = |id, past| tessera_common::wire::generate::SequenceStep {
        id,
        step: 3,
        fresh: false,
        past,
    };
    let steps = tessera_common::wire::generate::Steps::batch(vec![row(5, 7), row(6, 2), row(8, 9)]);
    assert_eq!(steps.positions, 9);
    stream.extend(
        TensorHeader::new(3, 9, "y", &t)
            .in_sequence(Some(steps.clone()))
            .encode(&limits)
            .unwrap(),
    );
    for c in chunks(&t.shared_bytes(), 4096) {
        stream.extend_from_slice(&c);
    }
    for piece in [1usize, 7, 100, 65536] {
        let mut d = FrameDecoder::<ToWorker>::new(limits);
        let mut frames = Vec::new();
        for part in stream.chunks(piece) {
            d.push(part).unwrap();
            while let Some(f) = d.next_frame().unwrap() {
                frames.push(f);
            }
        }
        d.finish().unwrap();
        assert_eq!(frames.len(), 3, "read size {piece}");
        assert_eq!(frames[0], Frame::Handshake(hello.clone()));
        assert_eq!(frames[1], Frame::Control(deploy.clone(), model.clone()));
        let Frame::Tensor(h, payload) = frames[2].clone() else {
            panic!("a tensor frame")
        };
        assert_eq!((h.network, h.request, h.name.as_str()), (3, 9, "y"));
        assert_eq!(h.sequence, Some(steps.clone()));
        assert_eq!(h.into_tensor(payload).unwrap(), t);
    }
}

#[test]
fn malformed_sequence_steps_are_refused_with_the_tensor() {
    use tessera_common::wire::generate::{SequenceStep, Steps};
    let t = Tensor::from_values(vec![2, 2], &[1.0f32; 4]).unwrap();
    let row = |id, fresh, past| SequenceStep {
        id,
        step: 1,
        fresh,
        past,
    };
    let bad = [
        (
            Steps {
                rows: vec![],
                positions: 0,
            },
            "without rows",
        ),
        (
            Steps::batch(vec![row(1, true, 0), row(2, false, 3)]),
            "fresh step batched",
        ),
        (
            Steps {
                rows: vec![row(1, false, 5)],
                positions: 4,
            },
            "more than the batch's 4",
        ),
        (
            Steps::batch(vec![row(1, false, 5), row(1, false, 5)]),
            "twice",
        ),
    ];
    for (steps, why) in bad {
        let h = TensorHeader::new(1, 1, "x", &t).in_sequence(Some(steps));
        let err = h.into_tensor(t.shared_bytes()).unwrap_err().to_string();
        assert!(err.contains(why), "{err}");
    }
}

#[test]
fn chunks_are_slices_of_one_buffer() {
    let payload = Bytes::from((0..=255u8).collect::<Vec<_>>());
    let parts: Vec<Bytes> = chunks(&payload, 100).collect();
    assert_eq!(
        parts.iter().map(Bytes::len).collect::<Vec<_>>(),
        [100, 100, 56]
    );
    assert_eq!(parts[1].as_ptr(), payload[100..].as_ptr());
    assert_eq!(parts.concat(), payload.to_vec());
}

#[test]
fn oversized_frames_are_refused_from_the_prefix() {
    let small = Limits {
        max_header: 64,
        max_payload: 1024,
    };
    // A header over the limit is refused when encoding...
    let big = ClientReply::Failed(Failure {
        request: None,
        kind: ErrorKind::Internal,
        error: "x".repeat(100),
    });
    assert!(matches!(
        big.encode(0, &small),
        Err(WireError::Encode { .. })
    ));
    // ... and when decoding, before reading the body.
    let bytes = big.encode(0, &Limits::default()).unwrap();
    assert!(matches!(
        decode_all::<ClientReply>(&bytes, small),
        Err(WireError::HeaderTooLarge { .. })
    ));
    let prefix = Prefix {
        kind: tessera_common::wire::FrameKind::Tensor,
        header_len: 10,
        payload_len: 1 << 40,
        shared: false,
    };
    assert_eq!(
        Prefix::decode(&prefix.encode(), &small),
        Err(WireError::PayloadTooLarge {
            len: 1 << 40,
            max: 1024
        })
    );
}

#[test]
fn garbled_and_truncated_frames_are_errors() {
    let limits = Limits::default();
    let frame = WorkerReport::Heartbeat {
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
    let mut bad = frame.clone();
    bad[0] = b'X';
    assert!(matches!(
        decode_all::<WorkerReport>(&bad, limits),
        Err(WireError::BadMagic(_))
    ));
    let mut bad = frame.clone();
    bad[2] = 99;
    assert_eq!(
        decode_all::<WorkerReport>(&bad, limits),
        Err(WireError::UnknownKind(99))
    );
    let mut bad = frame.clone();
    bad[Prefix::LEN] = 200; // an enum variant that does not exist
    assert!(matches!(
        decode_all::<WorkerReport>(&bad, limits),
        Err(WireError::Decode { .. })
    ));
    assert!(matches!(
        decode_all::<WorkerReport>(&frame[..frame.len() - 1], limits),
        Err(WireError::Truncated(_))
    ));
    // A tensor payload that does not match its header (2 floats, 4 bytes).
    let t = Tensor::from_values(vec![2], &[1f32, 2.0]).unwrap();
    let frame = TensorHeader::new(1, 1, "x", &t).encode(&limits).unwrap();
    let mut p = [0u8; Prefix::LEN];
    p.copy_from_slice(&frame[..Prefix::LEN]);
    let mut prefix = Prefix::decode(&p, &limits).unwrap();
    prefix.payload_len = 4;
    let mut stream = prefix.encode().to_vec();
    stream.extend_from_slice(&frame[Prefix::LEN..]);
    stream.extend_from_slice(&[0u8; 4]);
    assert!(matches!(
        decode_all::<WorkerReport>(&stream, limits),
        Err(WireError::Tensor { .. })
    ));
}

#[test]
fn string_and_packed_tensors_travel_and_bad_ones_are_refused() {
    let limits = Limits::default();
    let strings = Tensor::from_strings(vec![3], &["a", "", "héllo"]).unwrap();
    let int4 = Tensor::new(
        tessera_common::onnx::ElemType::INT4,
        vec![3],
        vec![0x21, 0x0f],
    )
    .unwrap();
    for t in [&strings, &int4] {
        let mut stream = TensorHeader::new(1, 2, "s", t).encode(&limits).unwrap();
        stream.extend_from_slice(t.bytes());
        match decode_all::<PeerMessage>(&stream, limits)
            .unwrap()
            .as_slice()
        {
            [Frame::Tensor(header, payload)] => {
                let back = header.clone().into_tensor(payload.clone()).unwrap();
                assert_eq!(&back, t);
            }
            other => panic!("expected one tensor frame, got {other:?}"),
        }
    }
    // A string payload that does not hold its strings: refused as a tensor.
    let mut header = TensorHeader::new(1, 2, "s", &strings);
    let garbled = Bytes::from(vec![9u8; strings.bytes().len()]);
    assert!(header.clone().into_tensor(garbled).is_err());
    // A header whose byte length disagrees with a fixed-size type's shape.
    let floats = Tensor::from_values(vec![2], &[1f32, 2.0]).unwrap();
    let mut lying = TensorHeader::new(1, 2, "f", &floats);
    lying.bytes = 4;
    assert!(lying.encode(&limits).is_err());
    // Fewer bytes than the strings' lengths need.
    header.bytes = 8;
    assert!(header.encode(&limits).is_err());
}

#[test]
fn handshake_checks_version_cluster_and_role() {
    let ok = Hello::new("lab", "node-a", Role::Worker);
    assert_eq!(handshake::check(&ok, "lab", &[Role::Worker]), Ok(()));
    let mut old = ok.clone();
    old.protocol = PROTOCOL_VERSION + 1;
    let err = handshake::check(&old, "lab", &[Role::Worker]).unwrap_err();
    assert!(matches!(err, HandshakeError::Version { .. }));
    assert!(err.to_string().contains("protocol version"));
    let err = handshake::check(&ok, "prod", &[Role::Worker]).unwrap_err();
    assert!(
        err.to_string().contains("cluster 'lab', not 'prod'"),
        "{err}"
    );
    let err = handshake::check(&ok, "lab", &[Role::Client]).unwrap_err();
    assert!(err.to_string().contains("expected client"), "{err}");
}

/// A reader that asks for `wanted()` bytes at a time (as `tessera-net`
/// reads a QUIC stream) never takes bytes of the next frame, and the
/// decoder says when a frame is under way.
#[test]
fn reading_what_is_wanted_stops_at_each_frame() {
    let limits = Limits::default();
    let t = Tensor::from_values(vec![300], &vec![1.5f32; 300]).unwrap();
    let one = |id| {
        let mut b = TensorHeader::new(1, id, "t", &t).encode(&limits).unwrap();
        b.extend_from_slice(t.bytes());
        b
    };
    let (first, second) = (one(1), one(2));
    let stream: Vec<u8> = first.iter().chain(&second).copied().collect();
    let mut at = 0;
    for (id, len) in [(1u64, first.len()), (2, second.len())] {
        let mut d = FrameDecoder::<PeerMessage>::new(limits);
        let start = at;
        let frame = loop {
            if let Some(f) = d.next_frame().unwrap() {
                break f;
            }
            let want = d.wanted();
            assert!(want > 0);
            // At most 100 bytes a read, never past the frame.
            let take = want.min(100);
            d.push(&stream[at..at + take]).unwrap();
            at += take;
            assert!(at - start <= len, "read past frame {id}");
        };
        assert!(!d.in_frame() && d.pending() == 0);
        let Frame::Tensor(h, _) = frame else {
            panic!("a tensor frame")
        };
        assert_eq!(h.request, id);
        d.finish().unwrap();
    }
    assert_eq!(at, stream.len());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Random bytes, fed in random pieces, never panic the decoder.
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), piece in 1usize..64) {
        let mut d = FrameDecoder::<ClientRequest>::new(Limits { max_header: 256, max_payload: 4096 });
        for part in bytes.chunks(piece) {
            d.push(part).unwrap();
            if d.next_frame().is_err() {
                break;
            }
        }
    }

    /// A valid prefix followed by random header bytes never panics either.
    #[test]
    fn random_headers_never_panic(kind in 1u8..4, header in proptest::collection::vec(any::<u8>(), 0..200)) {
        let mut frame = Vec::new();
        frame.extend_from_slice(b"TS");
        frame.push(kind);
        frame.push(0);
        frame.extend_from_slice(&(header.len() as u32).to_le_bytes());
        frame.extend_from_slice(&0u64.to_le_bytes());
        frame.extend_from_slice(&header);
        let mut d = FrameDecoder::<WorkerReport>::new(Limits::default());
        d.push(&frame).unwrap();
        let _ = d.next_frame();
    }

    /// Tensor frames round-trip any shape and type.
    #[test]
    fn tensor_frames_round_trip(dims in proptest::collection::vec(0usize..5, 0..4), seed in any::<u8>()) {
        let n: usize = dims.iter().product();
        let values: Vec<i32> = (0..n).map(|i| i as i32 * i32::from(seed)).collect();
        let t = Tensor::from_values(dims, &values).unwrap();
        let limits = Limits::default();
        let mut bytes = TensorHeader::new(1, 2, "t", &t).encode(&limits).unwrap();
        bytes.extend_from_slice(t.bytes());
        let frames = decode_all::<PeerMessage>(&bytes, limits).unwrap();
        let Frame::Tensor(h, payload) = frames[0].clone() else { panic!("tensor") };
        prop_assert_eq!(h.into_tensor(payload).unwrap(), t);
    }
}

#[test]
fn every_control_message_round_trips() {
    use tessera_common::graph::Dim;
    use tessera_common::onnx::ElemType;
    use tessera_common::plan::ReportedType;
    use tessera_common::wire::control::{
        DeviceAnswer, DeviceInfo, LinkRate, LoadRequest, ModelState, ModelStatus, NodeTime,
        SequenceLoad, SubgraphLoad, Transfer, TypeReport, WorkerState,
    };
    use tessera_common::wire::data::{DataReply, DataRequest, Open, SampledToken, Sampling};
    use tessera_common::wire::generate::{SequenceStep, Steps};
    use tessera_common::wire::routes::{
        CopyLoad, CopyRoute, CopyState, DeploymentRoute, GenerationLimits, HostRoute, RoutingTable,
        Signature, TensorSig,
    };
    let device = DeviceInfo {
        device: "CPU".into(),
        full_name: "EPYC".into(),
        gflops: 100.0,
        bandwidth_gbps: 5.0,
        memory_bytes: 16 << 30,
        metrics: vec![("CORES".into(), "2".into())],
    };
    let transfer = Transfer {
        request: 4,
        tensor: "pool2".into(),
        from: "node-a".into(),
        to: "node-b".into(),
        bytes: 32768,
        micros: 290,
    };
    let node = NodeTime {
        node: "conv1".into(),
        micros: 312,
    };
    round_trip(vec![
        WorkerReport::Register {
            name: "node-a".into(),
            data_addr: "127.0.0.1:7501".into(),
            devices: vec![device.clone()],
            holds: vec![HeldSubgraph {
                deployment: 3,
                subgraph: 1,
                model_hash: "ab".repeat(32),
            }],
            sequences: vec![],
            compiles: CompileCounts {
                compiled: 2,
                cache_loads: 1,
            },
        },
        WorkerReport::Heartbeat {
            seq: 9,
            in_flight: 2,
            subgraphs: vec![SubgraphLoad {
                network: 3,
                subgraph: 1,
                depth: 4,
                runs: 1000,
                busy_us: 5_000_000,
                failed: 1,
            }],
            sequences: vec![SequenceLoad {
                network: 3,
                kept: 2,
                waiting: 1,
            }],
            links: vec![LinkRate {
                peer: "node-b".into(),
                tensors: 10,
                bytes: 1 << 20,
                micros: 900,
            }],
            rss_bytes: 300 << 20,
            compiles: CompileCounts {
                compiled: 2,
                cache_loads: 1,
            },
        },
        WorkerReport::WatchLeader {
            name: "node-a".into(),
        },
    ]);
    let steps = Steps::one(SequenceStep {
        id: 77,
        step: 3,
        fresh: false,
        past: 12,
    });
    round_trip(vec![
        DataRequest::Open(Open {
            deployment: 3,
            request: 2,
            inputs: 1,
            counters: true,
            sequence: Some(steps),
            sampling: vec![Sampling {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
                seed: 5,
                index: 2,
                logprobs: 3,
            }],
        }),
        DataRequest::Cancel { request: 2 },
        DataRequest::EndSequence {
            deployment: 3,
            sequence: 77,
        },
    ]);
    round_trip(vec![
        DataReply::Ran {
            subgraph: 0,
            micros: 1100,
            nodes: vec![node.clone()],
        },
        DataReply::Moved(transfer.clone()),
        DataReply::Sampled(vec![SampledToken {
            id: 42,
            logprob: Some(-0.5),
            top: vec![(42, -0.5), (7, -1.5)],
        }]),
        DataReply::Unreachable {
            error: "cannot reach worker node-b".into(),
        },
        DataReply::Failed(Failure {
            request: Some(2),
            kind: ErrorKind::Busy,
            error: "every sequence place is taken".into(),
        }),
        DataReply::Busy {
            retry_after_ms: 5,
            reason: "subgraph 0 holds 64 requests".into(),
        },
        DataReply::Done,
    ]);
    round_trip(vec![
        CoordinatorAnswer::Registered {
            heartbeat_ms: 1000,
            adopted: vec![3],
            epoch: 2,
        },
        CoordinatorAnswer::Failed(Failure::of_operation(ErrorKind::Refused, "name taken")),
        CoordinatorAnswer::Standby {
            leader: Some("10.0.0.2:7400".into()),
            epoch: 91,
        },
        CoordinatorAnswer::Leading { epoch: 104 },
    ]);
    round_trip(vec![
        ToWorker::QueryNetwork {
            devices: vec!["CPU".into()],
            epoch: 3,
        },
        ToWorker::Model,
        ToWorker::Undeploy {
            network: 1,
            epoch: 3,
        },
        ToWorker::Weights {
            sha256: vec!["ab".repeat(32)],
            source: Some("models/m.onnx".into()),
            epoch: 3,
        },
    ]);
    let answers = vec![DeviceAnswer {
        types: vec![TypeReport {
            tensor: "t".into(),
            found: ReportedType {
                elem: Some(ElemType::FLOAT),
                shape: Some(vec![Dim::Known(1), Dim::Unknown]),
            },
        }],
        device: "node-a/CPU".into(),
        supported: vec!["conv1".into()],
        unsupported: vec![("loop".into(), "Loop is not supported".into())],
    }];
    let progress = Progress {
        what: "compiling".into(),
        done: 1,
        total: 2,
    };
    round_trip(vec![
        WorkerAnswer::Progress(progress.clone()),
        WorkerAnswer::Failed(Failure::of_operation(ErrorKind::Worker, "no such device")),
        WorkerAnswer::QueryResult {
            answers: answers.clone(),
        },
        WorkerAnswer::NeedModel { missing: vec![1] },
        WorkerAnswer::Deployed {
            network: 1,
            subgraph: 0,
            compile_ms: 12,
            cached: true,
        },
        WorkerAnswer::Undeployed { network: 1 },
        WorkerAnswer::Weights { held: vec![0, 2] },
    ]);
    round_trip(vec![
        ClientRequest::QueryNetwork {
            devices: vec!["HETERO:node-a/CPU".into()],
        },
        ClientRequest::LoadNetwork(LoadRequest {
            name: "m".into(),
            devices: "HETERO:node-a/CPU".into(),
            policy: tessera_common::affinity::Policy::Cost,
            strict: true,
            affinity: vec![("conv3".into(), "node-b/CPU".into())],
            dry_run: true,
            shapes: vec![("x".into(), vec![1, 3, 64, 64])],
            replicas: tessera_common::wire::control::Replicas::Auto,
            batching: None,
            generation: None,
            embedding: None,
        }),
        ClientRequest::LoadModel {
            name: "rec".into(),
            request: None,
        },
        ClientRequest::UnloadModel { name: "rec".into() },
        ClientRequest::ListModels,
        ClientRequest::ClusterInfo,
        ClientRequest::Routes {
            network: 0,
            model: Some("rec".into()),
        },
        ClientRequest::Generation { network: 1 },
        ClientRequest::Unload { network: 1 },
        ClientRequest::Plan { network: 3 },
        ClientRequest::Embedding { network: 3 },
    ]);
    round_trip(vec![
        ClientReply::Progress(progress),
        ClientReply::Failed(Failure {
            request: Some(2),
            kind: ErrorKind::Timeout,
            error: "request 2 missed its deadline".into(),
        }),
        ClientReply::QueryResult { answers },
        ClientReply::NetworkLoaded {
            network: 1,
            plan: Box::new(tessera_common::dump::PlanReport {
                hosts: vec!["node-a".into()],
                network: 1,
                ..Default::default()
            }),
        },
        ClientReply::ModelUnloaded { name: "rec".into() },
        ClientReply::Models {
            models: vec![ModelStatus {
                name: "rec".into(),
                state: ModelState::Ready,
                network: 4,
                reason: String::new(),
            }],
        },
        ClientReply::ClusterState {
            workers: vec![WorkerState {
                name: "node-a".into(),
                data_addr: "127.0.0.1:7501".into(),
                devices: vec![device],
                silent_ms: 20,
                rtt_us: 300,
                bandwidth_gbps: 1.5,
                networks: vec![1],
                running: 3,
                memory_in_use: vec![("CPU".into(), 64 << 20)],
                state_in_use: vec![("CPU".into(), 8 << 20)],
                rss_bytes: 200 << 20,
                compiles: CompileCounts {
                    compiled: 2,
                    cache_loads: 5,
                },
                phase: WorkerPhase::Draining,
            }],
            networks: 1,
            in_flight: 0,
            coordinators: vec![CoordinatorInfo {
                addr: "10.0.0.1:7400".into(),
                epoch: 88,
                leading: true,
            }],
        },
        ClientReply::Coordinators {
            leading: false,
            leader: Some("10.0.0.1:7400".into()),
            epoch: 88,
            coordinators: Vec::new(),
        },
        ClientReply::NotLeader { leader: None },
        ClientReply::Routes(Box::new(RoutingTable {
            network: 1,
            name: "rec".into(),
            version: 4,
            signature: Signature {
                inputs: vec![TensorSig {
                    name: "x".into(),
                    elem: Some(1),
                    shape: Some(vec![Dim::Sym("batch".into()), Dim::Known(3)]),
                }],
                outputs: vec![TensorSig {
                    name: "logits".into(),
                    elem: None,
                    shape: None,
                }],
            },
            copies: vec![
                CopyRoute {
                    index: 1,
                    state: CopyState::Ready,
                    deployment: Some(DeploymentRoute {
                        id: 3,
                        hosts: vec![HostRoute {
                            name: "node-a".into(),
                            data_addr: "127.0.0.1:7501".into(),
                        }],
                        inputs: vec![("x".into(), vec!["node-a".into()])],
                        outputs: vec![("logits".into(), "node-a".into())],
                        triggers: vec![],
                        state_triggers: vec!["node-a".into()],
                        state_outputs: vec!["present.0.key".into()],
                        predicted_latency_us: 1200.0,
                    }),
                    load: CopyLoad {
                        queued: 2,
                        sequences: 1,
                        waiting: 0,
                        rate: 30.5,
                    },
                    retiring: vec![2],
                },
                CopyRoute {
                    index: 2,
                    state: CopyState::Broken("node-b was lost".into()),
                    deployment: None,
                    load: CopyLoad::default(),
                    retiring: vec![],
                },
            ],
            generation: Some(GenerationLimits {
                state: vec![],
                max_sequences: 4,
                max_queued: 64,
                queue_timeout_ms: 30_000,
                context_length: 2048,
            }),
            embedding: None,
            loss_grace_ms: 2500,
        })),
        ClientReply::Unloaded { network: 1 },
        ClientReply::Embedding(Box::new(tessera_common::wire::embed::EmbeddingSpec {
            tokenizer_bytes: 12,
            tokenizer_path: "tok.json".into(),
            pooling: tessera_common::wire::embed::Pooling::Cls,
            normalize: true,
            max_length: 128,
            output: "hidden".into(),
            ..Default::default()
        })),
    ]);
}

/// Each message of one channel encodes and decodes to itself.
fn round_trip<M: Message + PartialEq + Clone>(messages: Vec<M>) {
    let limits = Limits::default();
    for msg in messages {
        let bytes = msg.encode(0, &limits).unwrap();
        let frames = decode_all::<M>(&bytes, limits).unwrap();
        assert_eq!(
            frames,
            vec![Frame::Control(msg.clone(), Bytes::new())],
            "{}",
            msg.name()
        );
    }
}

#[test]
fn a_control_message_on_a_data_stream_is_refused() {
    let limits = Limits::default();
    let beat = WorkerReport::Heartbeat {
        seq: 1,
        in_flight: 0,
        subgraphs: vec![],
        sequences: vec![],
        links: vec![],
        rss_bytes: 0,
        compiles: Default::default(),
    };
    let bytes = beat.encode(0, &limits).unwrap();
    match decode_all::<PeerMessage>(&bytes, limits) {
        Err(WireError::Decode { what, .. }) => assert!(what.contains("none is taken"), "{what}"),
        other => panic!("expected a decode error, got {other:?}"),
    }
    // What a worker's data stream does carry still decodes.
    let t = Tensor::from_values(vec![2], &[1f32, 2.0]).unwrap();
    let mut bytes = TensorHeader::new(1, 1, "x", &t).encode(&limits).unwrap();
    bytes.extend_from_slice(t.bytes());
    assert!(matches!(
        decode_all::<PeerMessage>(&bytes, limits)
            .unwrap()
            .as_slice(),
        [Frame::Tensor(..)]
    ));
}
