//! The serving ports locked down, with real processes and real clients: a
//! coordinator serving HTTPS and gRPC over TLS with its cluster
//! certificate, bearer tokens from a file and model control off (the
//! default), two worker processes, and PP-OCRv4 rec and MiniLM split over
//! them. `tests/python/secure_test.py` (curl, tritonclient[http] with
//! ssl=True) and `tests/python/grpc_test.py --ssl --token`
//! (tritonclient[grpc] verifying the cluster CA) check tokens, TLS, the
//! refusals and inference against onnxruntime. A coordinator listening on
//! every address without tokens warns at start.

use crate::util;

use std::process::Command;

use util::cluster::{Cluster, Proc};
use util::kserve::{free_port, python};

const TOKEN: &str = "t0k3n-for-the-secure-test";

#[test]
fn https_grpc_over_tls_tokens_and_model_control_off() {
    let rec = util::model("ch_PP-OCRv4_rec_infer.onnx");
    let minilm = util::model("paraphrase-MiniLM-L3-v2.onnx");
    let (http, grpc) = (free_port(), free_port());
    let secrets = util::Scratch::new("kserve-secure-tokens");
    let tokens = secrets.join("tokens.txt");
    std::fs::write(&tokens, format!("# test clients\n{TOKEN}\n")).unwrap();
    let config = format!(
        "http_listen = \"127.0.0.1:{http}\"\ngrpc_listen = \"127.0.0.1:{grpc}\"\n\
         http_max_body_bytes = {}\n\
         [models.rec]\npath = {:?}\ndevices = \"HETERO:node-a/CPU,node-b/CPU\"\n\
         shapes = {{ x = [1, 3, 48, 320] }}\n\
         [models.minilm]\npath = {:?}\ndevices = \"HETERO:node-b/CPU,node-a/CPU\"\n\
         [serving]\ntls = true\ntokens_file = {:?}\n",
        1 << 20,
        rec.display().to_string(),
        minilm.display().to_string(),
        tokens.display().to_string(),
    );
    let mut cluster = Cluster::start_configured(
        "kserve-secure",
        &[("node-a", "CPU"), ("node-b", "CPU")],
        1,
        &config,
    );
    let ca = cluster.certs.join("ca.pem");
    let ca = ca.to_str().unwrap();
    let http_url = format!("127.0.0.1:{http}");
    let grpc_url = format!("127.0.0.1:{grpc}");
    python(
        "secure_test.py",
        &http_url,
        &["--ca", ca, "--tokens", tokens.to_str().unwrap()],
    );
    python(
        "grpc_test.py",
        &grpc_url,
        &["--http", &http_url, "--ssl", ca, "--token", TOKEN],
    );
    // SIGHUP reads the tokens file again (and stops nothing).
    let reads = |log: &str| log.matches("tokens read").count();
    let before = reads(&cluster.coordinator.log_text());
    let hup = Command::new("kill")
        .args(["-HUP", &cluster.coordinator.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    let started = std::time::Instant::now();
    while reads(&cluster.coordinator.log_text()) == before {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "SIGHUP did not reload the tokens:\n{}",
            cluster.coordinator.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        cluster.coordinator.running(),
        "SIGHUP stopped the coordinator"
    );
    let log = cluster.coordinator.log_text();
    assert!(!log.contains(TOKEN), "a token in the coordinator's log");
    assert!(
        !log.contains("without a token"),
        "a loopback listener with tokens needs no warning:\n{log}"
    );
}

/// A folder with a lone coordinator's certificates and a cluster.toml
/// with `extra` appended; the folder and the config file.
fn lone_coordinator(name: &str, extra: &str) -> (util::Scratch, std::path::PathBuf) {
    let dir = util::Scratch::new(name);
    let certs = dir.join("certs");
    util::cluster::certs_init(&certs, "lone", &["coordinator"]);
    let config = dir.join("cluster.toml");
    std::fs::write(
        &config,
        format!(
            "cluster = \"lone\"\nlisten = \"127.0.0.1:0\"\ncerts = {:?}\n{extra}\n",
            certs.display().to_string()
        ),
    )
    .unwrap();
    (dir, config)
}

/// A coordinator whose HTTP and gRPC listeners are open to other hosts
/// without tokens says so once at start; the same on loopback does not.
#[test]
fn an_open_listener_without_tokens_warns_at_start() {
    let warns = |listen: &str| {
        let (dir, config) = lone_coordinator(
            "kserve-open-warning",
            &format!("http_listen = \"{listen}:0\"\ngrpc_listen = \"{listen}:0\""),
        );
        let (coordinator, _) = Proc::start(
            "coordinator",
            env!("CARGO_BIN_EXE_coordinator"),
            &["--config".into(), config.display().to_string()],
            &dir,
            "listening on ",
            "info",
        );
        let log = coordinator.log_text();
        drop(coordinator);
        log.matches("without a token").count()
    };
    assert_eq!(warns("0.0.0.0"), 1, "one warning for both listeners");
    assert_eq!(warns("127.0.0.1"), 0);
}

/// Serving settings that cannot work stop the coordinator at start with a
/// message naming the key and the file.
#[test]
fn bad_serving_settings_fail_at_start() {
    for (serving, wanted) in [
        (
            "tokens_file = \"/nonexistent/tokens.txt\"",
            "[serving] tokens_file /nonexistent/tokens.txt",
        ),
        (
            "model_repository = \"/nonexistent/models\"",
            "[serving] model_repository /nonexistent/models",
        ),
        (
            "tls = true\ntls_cert = \"/nonexistent/cert.pem\"\ntls_key = \"/nonexistent/key.pem\"",
            "[serving] TLS certificate /nonexistent/cert.pem",
        ),
    ] {
        let (_dir, config) = lone_coordinator(
            "kserve-bad-serving",
            &format!("http_listen = \"127.0.0.1:0\"\n[serving]\n{serving}"),
        );
        let out = Command::new(env!("CARGO_BIN_EXE_coordinator"))
            .args(["--config", config.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{serving}: started");
        assert!(stderr.contains(wanted), "{serving}: {stderr}");
    }
}
