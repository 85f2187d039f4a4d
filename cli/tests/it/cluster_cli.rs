//! `tessera cluster`, `query`, `plan`, `bench` and `run --coordinator`
//! against real `coordinator` and `worker` processes; a re-deployed
//! subgraph comes from the workers' compile cache.

use crate::util;

use util::cluster::Cluster;
use util::tessera;

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/models/small_cnn.onnx"
);
const AFFINITY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/small_cnn_affinity.json"
);

fn run(cluster: &Cluster, args: &[&str]) -> String {
    let mut all: Vec<&str> = args.to_vec();
    let client = cluster.client_args();
    all.extend(client.iter().map(String::as_str));
    let (ok, stdout, stderr) = tessera(&all);
    assert!(ok, "tessera {args:?}: {stderr}");
    println!("$ tessera {}\n{stdout}", args.join(" "));
    stdout
}

#[test]
fn cluster_query_plan_bench_and_run_on_a_real_cluster() {
    let cluster = Cluster::start("cli", &["node-a", "node-b"], 1);
    let out = run(&cluster, &["cluster"]);
    assert!(out.starts_with("2 workers"), "{out}");
    assert!(
        out.contains("node-a/CPU: ") && out.contains("node-b/CPU: "),
        "{out}"
    );

    let out = run(&cluster, &["query", MODEL]);
    assert!(out.contains("node-a/CPU: supports 12 of 12 nodes"), "{out}");
    assert!(out.contains("node-b/CPU: supports 12 of 12 nodes"), "{out}");

    let dumps = cluster.dir.join("dumps");
    let out = run(
        &cluster,
        &[
            "plan",
            MODEL,
            "--devices",
            "HETERO:node-a/CPU,node-b/CPU",
            "--affinity",
            AFFINITY,
            "--dump-dir",
            dumps.to_str().unwrap(),
            "--explain",
        ],
    );
    assert!(out.contains("2 subgraphs on node-a, node-b"), "{out}");
    assert!(out.contains("predicted total: "), "{out}");
    assert!(out.contains("conv3 → node-b/CPU"), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dumps.join("small_cnn_plan.json")).unwrap())
            .unwrap();
    assert_eq!(json["subgraphs"].as_array().unwrap().len(), 2);
    assert!(
        json["subgraphs"][1]["predicted_transfer_us"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let dot = std::fs::read_to_string(dumps.join("small_cnn_plan.dot")).unwrap();
    assert!(dot.contains("subgraph1 on node-b/CPU") && dot.contains("\"pool2\" -> \"conv3\""));

    let out = run(
        &cluster,
        &[
            "bench",
            MODEL,
            "--devices",
            "HETERO:node-a/CPU,node-b/CPU",
            "--affinity",
            AFFINITY,
            "--requests",
            "32",
            "--concurrency",
            "8",
        ],
    );
    assert!(out.contains("32 requests, 8 in flight: "), "{out}");

    // The same subgraphs again: compiled ones come from the cache.
    let out = run(
        &cluster,
        &[
            "run",
            MODEL,
            "--devices",
            "HETERO:node-a/CPU,node-b/CPU",
            "--affinity",
            AFFINITY,
            "--random",
            "--perf-counts",
        ],
    );
    assert!(out.contains("subgraph1 (node-b/CPU): "), "{out}");
    for w in &cluster.workers {
        let log = w.log_text();
        assert!(
            log.contains("cached=false") && log.contains("cached=true"),
            "{}: compiled once, then from the cache:\n{log}",
            w.name
        );
    }
}

#[test]
fn named_models_load_list_replace_and_unload_from_the_cli() {
    let cluster = Cluster::start("cli-models", &["node-a"], 1);
    let out = run(&cluster, &["models"]);
    assert_eq!(out, "no named models\n");

    let out = run(
        &cluster,
        &["load", "cnn", MODEL, "--devices", "HETERO:node-a/CPU"],
    );
    assert!(out.starts_with("model cnn loaded as network "), "{out}");
    let first = out.split_whitespace().nth(5).unwrap().to_string();
    let out = run(&cluster, &["models"]);
    assert_eq!(out, format!("cnn: READY (network {first})\n"));

    // Loading the name again replaces its network.
    let out = run(&cluster, &["load", "cnn", MODEL]);
    let second = out.split_whitespace().nth(5).unwrap().to_string();
    assert_ne!(first, second, "{out}");
    let out = run(&cluster, &["models"]);
    assert_eq!(out, format!("cnn: READY (network {second})\n"));

    let out = run(&cluster, &["unload", "cnn"]);
    assert_eq!(out, "model cnn unloaded\n");
    let out = run(&cluster, &["models"]);
    assert_eq!(out, "cnn: UNLOADED\n");

    let (ok, _, err) = tessera(&[
        "load",
        "a/b",
        MODEL,
        "--coordinator",
        &cluster.addr.to_string(),
        "--certs",
        cluster.certs.to_str().unwrap(),
        "--cluster",
        util::cluster::CLUSTER,
    ]);
    assert!(!ok && err.contains("not a model name"), "{err}");
    let (ok, _, err) = tessera(&["models"]);
    assert!(!ok && err.contains("give --coordinator"), "{err}");
}

#[test]
fn bench_takes_inputs_from_files_and_shapes() {
    let cluster = Cluster::start("cli-bench-inputs", &["node-a"], 1);
    let bytes = std::fs::read(MODEL).unwrap();
    let graph = tessera_common::graph::Graph::from_model(
        tessera_common::onnx::decode_model(&bytes).unwrap(),
    )
    .unwrap();
    let input = graph.tensor(graph.inputs[0]);
    let inputs = tessera_common::synth::random_inputs(&graph, 3).unwrap();
    let npy = cluster.dir.join("x.npy");
    std::fs::write(
        &npy,
        tessera_common::tensor::write_npy(&inputs[0].1).unwrap(),
    )
    .unwrap();
    let given = format!("{}={}", input.name, npy.display());
    let out = run(
        &cluster,
        &[
            "bench",
            MODEL,
            "--input",
            &given,
            "--requests",
            "8",
            "--concurrency",
            "2",
        ],
    );
    assert!(out.contains("8 requests, 2 in flight: "), "{out}");

    let mut args = vec!["bench", MODEL, "--input", "nope=x.npy"];
    let client = cluster.client_args();
    args.extend(client.iter().map(String::as_str));
    let (ok, _, err) = tessera(&args);
    assert!(!ok && err.contains("cannot read x.npy"), "{err}");
    let wrong = format!("nope={}", npy.display());
    let mut args = vec!["bench", MODEL, "--input", &wrong];
    args.extend(client.iter().map(String::as_str));
    let (ok, _, err) = tessera(&args);
    assert!(!ok && err.contains("no such input"), "{err}");
}
