//! The coordinator as a KServe v2 server, with real clients and nothing
//! mocked: a coordinator process with `http_listen`, `grpc_listen`, model
//! control on with a model repository folder, and two named models
//! (PP-OCRv4 rec and the MiniLM transformer, each split over two worker
//! processes by a manual affinity), checked by `tests/python/kserve_test.py`
//! (HTTP: Triton's Python client tritonclient[http]==2.73.0, curl,
//! prometheus_client's parser, raw sockets for the limits) and
//! `tests/python/grpc_test.py` (gRPC: tritonclient[grpc]==2.73.0 and its
//! protobuf stubs); results compared with onnxruntime (tolerance 1e-4 ×
//! max(1, max |onnxruntime|)). Then the named models come back by
//! themselves after a worker is killed and after the coordinator is killed
//! and restarted. A worker's own front door keeps answering while the
//! coordinator is stopped, and a `tessera serve` gateway serves the same.

use crate::util;

use std::path::Path;
use std::time::Duration;

use util::cluster::Cluster;
use util::kserve::{free_port, python, split_models_config};

const MAX_BODY: usize = 1 << 20;
/// `[serving] header_timeout_ms`: short, so the slow-loris check is quick.
const HEADER_TIMEOUT_MS: u64 = 2000;

fn kserve(url: &str, phase: &str) {
    let max_body = MAX_BODY.to_string();
    let timeout = HEADER_TIMEOUT_MS.to_string();
    python(
        "kserve_test.py",
        url,
        &[
            "--phase",
            phase,
            "--max-body",
            &max_body,
            "--header-timeout-ms",
            &timeout,
        ],
    );
}

/// A model repository folder: PP-OCR cls as `cls.onnx`, and a link that
/// leads out of it (`escape.onnx`, to a model outside: refused as missing).
fn model_repository(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let cls = util::model("ch_ppocr_mobile_v2.0_cls_infer.onnx");
    std::fs::copy(&cls, dir.join("cls.onnx")).unwrap();
    std::os::unix::fs::symlink(
        util::model("magika_standard_v3_3.onnx"),
        dir.join("escape.onnx"),
    )
    .unwrap();
}

#[test]
fn tritonclient_curl_and_prometheus_against_two_workers() {
    let (port, grpc_port) = (free_port(), free_port());
    let repository = util::Scratch::new("kserve-repository");
    model_repository(&repository.join("models"));
    let config = format!(
        "http_listen = \"127.0.0.1:{port}\"\ngrpc_listen = \"127.0.0.1:{grpc_port}\"\n\
         http_max_body_bytes = {MAX_BODY}\n{}\
         [serving]\nmodel_control = true\nmodel_repository = {:?}\nheader_timeout_ms = {HEADER_TIMEOUT_MS}\n",
        split_models_config(),
        repository.join("models").display().to_string(),
    );
    let mut cluster = Cluster::start_configured(
        "kserve",
        &[("node-a", "CPU"), ("node-b", "CPU")],
        1,
        &config,
    );
    let url = format!("127.0.0.1:{port}");
    kserve(&url, "full");
    let grpc_url = format!("127.0.0.1:{grpc_port}");
    let max_body = MAX_BODY.to_string();
    python(
        "grpc_test.py",
        &grpc_url,
        &["--http", &url, "--max-body", &max_body, "--model-control"],
    );

    // A worker lost: the named models are re-planned onto the other one.
    cluster.workers[1].kill();
    kserve(&url, "serving");
    let log = cluster.coordinator.log_text();
    assert!(log.contains("re-planned"), "coordinator log:\n{log}");

    // The coordinator killed and restarted on the same addresses: the
    // remaining worker registers again and the configured models load by
    // themselves.
    cluster.restart_coordinator();
    kserve(&url, "serving");
}

/// node-a with its own front door (returned: its address) and node-b,
/// under a coordinator configured with `config`.
fn front_door_cluster(test: &str, config: &str) -> (Cluster, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let door: &[&str] = &["--http-listen", &listen];
    let cluster = Cluster::start_configured_with_args(
        test,
        &[("node-a", "CPU", door), ("node-b", "CPU", &[])],
        1,
        config,
    );
    (cluster, listen)
}

/// tritonclient requests through `listen` for `seconds`, every answer
/// checked against onnxruntime, on a thread of their own.
fn kserve_loop(listen: &str, seconds: u32) -> std::thread::JoinHandle<()> {
    let listen = listen.to_string();
    std::thread::spawn(move || {
        let seconds = seconds.to_string();
        python(
            "kserve_test.py",
            &listen,
            &["--phase", "loop", "--seconds", &seconds],
        )
    })
}

/// A worker's own front door (`worker --http-listen`) serves the named
/// models straight from the workers: it keeps answering, every answer
/// checked against onnxruntime, while the coordinator is paused with
/// SIGSTOP for 3 s (no request passes through the coordinator; the front
/// door holds each model's routing table).
#[test]
fn a_workers_front_door_keeps_answering_while_the_coordinator_is_stopped() {
    let (mut cluster, listen) = front_door_cluster("front-door", &split_models_config());
    // The front door answers before the pause (its routes followed).
    kserve(&listen, "serving");
    let looping = kserve_loop(&listen, 7);
    std::thread::sleep(Duration::from_secs(2));
    cluster.coordinator.pause();
    std::thread::sleep(Duration::from_secs(3));
    cluster.coordinator.resume();
    looping
        .join()
        .expect("every request through the worker's front door succeeded");
    // After the pause the workers are still members: nothing was re-planned.
    let log = cluster.coordinator.log_text();
    assert!(!log.contains("worker lost"), "{log}");
    kserve(&listen, "serving");
    // A gateway of its own (`tessera serve`, the client certificate)
    // serves the same models, compared with onnxruntime the same way.
    let gateway = format!("127.0.0.1:{}", free_port());
    let mut args = cluster.client_args();
    args.extend(["--http-listen".to_string(), gateway.clone()]);
    let mut serve = vec!["serve".to_string()];
    serve.extend(args);
    let (mut door, line) = util::cluster::Proc::start(
        "gateway",
        env!("CARGO_BIN_EXE_tessera"),
        &serve,
        &cluster.dir,
        "serving HTTP on ",
        "info",
    );
    assert_eq!(line, format!("serving HTTP on {gateway}"));
    kserve(&gateway, "serving");
    assert_eq!(door.terminate().and_then(|s| s.code()), Some(0));
}

/// A coordinator with a `state_dir`, killed (SIGKILL) and started again
/// while a tritonclient loop sends requests through a worker's front door:
/// every request succeeds and matches onnxruntime, and the restarted
/// coordinator adopts the named models' deployments (nothing re-planned).
#[test]
fn a_workers_front_door_answers_through_a_coordinator_kill_and_restart() {
    let config = format!("state_dir = \"{{dir}}/state\"\n{}", split_models_config());
    let (mut cluster, listen) = front_door_cluster("front-door-restart", &config);
    kserve(&listen, "serving");
    let looping = kserve_loop(&listen, 9);
    std::thread::sleep(Duration::from_secs(2));
    cluster.coordinator.kill();
    std::thread::sleep(Duration::from_secs(3));
    cluster.start_coordinator_again();
    looping
        .join()
        .expect("every request through the worker's front door succeeded");
    let log = std::fs::read_to_string(cluster.dir.join("coordinator-restarted.log")).unwrap();
    assert!(
        log.contains("adopted what the worker still serves"),
        "{log}"
    );
    assert!(!log.contains("re-planned"), "{log}");
    kserve(&listen, "serving");
}
