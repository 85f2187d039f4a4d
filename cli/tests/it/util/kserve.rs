//! Helpers of the serving tests: free ports, and the Python checks with
//! real clients (`tests/python/*.py`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The folder of the fetched test models.
pub fn models_dir() -> PathBuf {
    super::model("magika_standard_v3_3.onnx")
        .parent()
        .expect("models dir")
        .to_path_buf()
}

/// Runs `tests/python/SCRIPT URL MODELS ARGS...`; its output is printed,
/// and a failure fails the test with it.
pub fn python(script: &str, url: &str, args: &[&str]) {
    let path = format!("{}/../tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&path)
        .arg(url)
        .arg(models_dir())
        .args(args)
        .output()
        .expect("python3 with tritonclient[http,grpc] (scripts/test.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{script} {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `{ "node" = "host/CPU", ... }` pinning the second half of the model's
/// ops (as planned with `shapes`) to `host`.
pub fn second_half_on(model: &Path, shapes: &BTreeMap<String, Vec<usize>>, host: &str) -> String {
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

/// rec and MiniLM as named models, each split over node-a and node-b.
pub fn split_models_config() -> String {
    let rec = super::model("ch_PP-OCRv4_rec_infer.onnx");
    let minilm = super::model("paraphrase-MiniLM-L3-v2.onnx");
    let rec_shapes = BTreeMap::from([("x".to_string(), vec![1, 3, 48, 320])]);
    format!(
        "[models.rec]\npath = {:?}\ndevices = \"HETERO:node-a/CPU,node-b/CPU\"\n\
         shapes = {{ x = [1, 3, 48, 320] }}\naffinity = {}\n\
         [models.minilm]\npath = {:?}\ndevices = \"HETERO:node-b/CPU,node-a/CPU\"\naffinity = {}\n",
        rec.display().to_string(),
        second_half_on(&rec, &rec_shapes, "node-b"),
        minilm.display().to_string(),
        second_half_on(&minilm, &BTreeMap::new(), "node-a"),
    )
}
