//! The coordinator as a KServe v2 server, with real clients and nothing
//! mocked: a coordinator process with `http_listen` and two named models
//! (PP-OCRv4 rec and the MiniLM transformer, each split over two worker
//! processes by a manual affinity), checked by `tests/python/kserve_test.py`
//! with Triton's Python client (tritonclient[http]==2.73.0), curl and
//! prometheus_client's parser; results compared with onnxruntime
//! (tolerance 1e-4 × max(1, max |onnxruntime|)). Then the named models
//! come back by themselves after a worker is killed and after the
//! coordinator is killed and restarted.

mod util;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use util::cluster::Cluster;

const MAX_BODY: usize = 1 << 20;

/// A free TCP port on loopback.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `{ "node" = "host/CPU", ... }` pinning the second half of the model's
/// ops (as planned with `shapes`) to `host`.
fn second_half_on(model: &Path, shapes: &BTreeMap<String, Vec<usize>>, host: &str) -> String {
    let bytes = std::fs::read(model).unwrap();
    let proto = tessera_common::onnx::decode_model(&bytes).unwrap();
    let (graph, _) = tessera_common::plan::prepare(&proto, shapes).unwrap();
    let ops = graph.topo_ops();
    let pins: Vec<String> = ops[ops.len() / 2..]
        .iter()
        .map(|&n| format!("{:?} = \"{host}/CPU\"", graph.node(n).name))
        .collect();
    format!("{{ {} }}", pins.join(", "))
}

fn kserve(url: &str, phase: &str) {
    let models = util::model("magika_standard_v3_3.onnx")
        .parent()
        .expect("models dir")
        .to_path_buf();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/python/kserve_test.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .arg(url)
        .arg(&models)
        .args(["--phase", phase, "--max-body", &MAX_BODY.to_string()])
        .output()
        .expect("python3 with tritonclient[http] (scripts/test.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "kserve_test.py --phase {phase} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn tritonclient_curl_and_prometheus_against_two_workers() {
    let rec = util::model("ch_PP-OCRv4_rec_infer.onnx");
    let minilm = util::model("paraphrase-MiniLM-L3-v2.onnx");
    let rec_shapes = BTreeMap::from([("x".to_string(), vec![1, 3, 48, 320])]);
    let port = free_port();
    let config = format!(
        "http_listen = \"127.0.0.1:{port}\"\nhttp_max_body_bytes = {MAX_BODY}\n\
         [models.rec]\npath = {:?}\ndevices = \"HETERO:node-a/CPU,node-b/CPU\"\n\
         shapes = {{ x = [1, 3, 48, 320] }}\naffinity = {}\n\
         [models.minilm]\npath = {:?}\ndevices = \"HETERO:node-b/CPU,node-a/CPU\"\naffinity = {}\n",
        rec.display().to_string(),
        second_half_on(&rec, &rec_shapes, "node-b"),
        minilm.display().to_string(),
        second_half_on(&minilm, &BTreeMap::new(), "node-a"),
    );
    let mut cluster = Cluster::start_configured(
        "kserve",
        &[("node-a", "CPU"), ("node-b", "CPU")],
        1,
        &config,
    );
    let url = format!("127.0.0.1:{port}");
    kserve(&url, "full");

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
