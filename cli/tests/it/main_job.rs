//! The README's main job (`scripts/demo.sh`): `tessera run` on the
//! embedded local cluster with the bundled small CNN split over two
//! workers prints the plan and counters per subgraph, node and transfer, and its output is
//! onnxruntime's (max abs diff ≤ 1e-4). The bundled model is exactly what
//! `tessera example-model` generates.

use crate::util;

use tessera_common::onnx::{decode_model, encode_model};
use tessera_common::synth;
use tessera_common::tensor::read_npy;
use util::oracle::{max_abs_diff, onnxruntime};
use util::tessera;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

#[test]
fn the_bundled_model_is_the_generated_one() {
    let path = format!("{ROOT}/examples/models/small_cnn.onnx");
    let bundled = std::fs::read(&path).unwrap();
    assert_eq!(
        decode_model(&bundled).unwrap(),
        synth::small_cnn(7),
        "regenerate with `tessera example-model`"
    );
    assert_eq!(bundled, encode_model(&synth::small_cnn(7)));
}

#[test]
fn the_main_job_runs_on_an_embedded_cluster_and_matches_onnxruntime() {
    let dir = util::Scratch::new("main-job");
    let model = format!("{ROOT}/examples/models/small_cnn.onnx");
    let (ok, stdout, stderr) = tessera(&[
        "run",
        &model,
        "--devices",
        "HETERO:node-a/CPU,node-b/CPU",
        "--affinity",
        &format!("{ROOT}/examples/small_cnn_affinity.json"),
        "--random",
        "--seed",
        "1",
        "--perf-counts",
        "--output-dir",
        dir.join("out").to_str().unwrap(),
    ]);
    println!("{stderr}{stdout}");
    assert!(ok, "{stderr}");
    for line in [
        "2 subgraphs on node-a, node-b",
        "subgraph0 on node-a/CPU: 6 nodes",
        "subgraph1 on node-b/CPU: 6 nodes",
        "subgraph0 (node-a/CPU): ",
        "subgraph1 (node-b/CPU): ",
        // (pool1: onnxruntime fuses conv1 into relu1's kernel.)
        "subgraph0: pool1: realTime: ",
        "subgraph1: softmax: realTime: ",
        "transfer image client → node-a: 49152 bytes in ",
        "transfer pool2 node-a → node-b: 32768 bytes in ",
        "transfer probs node-b → client: 40 bytes in ",
        "Total compute: ",
        "output probs: float [1, 10]",
    ] {
        assert!(stdout.contains(line), "missing '{line}' in:\n{stdout}");
    }
    let got = read_npy(&std::fs::read(dir.join("out/probs.npy")).unwrap()).unwrap();
    let graph = tessera_common::graph::Graph::from_model(synth::small_cnn(7)).unwrap();
    let inputs = synth::random_inputs(&graph, 1).unwrap();
    let want = onnxruntime(model.as_ref(), &inputs, &dir.join("ort"));
    let diff = max_abs_diff(&got, &want[0]);
    assert!(diff <= 1e-4, "max abs diff {diff}");
}
