//! Sentence embeddings through `/v1/embeddings` on real worker processes:
//! paraphrase-MiniLM-L3-v2 (the corpus' MiniLM, with BERT's uncased
//! tokenizer) declared as an embedding model in cluster.toml, on one
//! worker (with dynamic batching) and split over two, gives through the
//! real `openai` Python client the vectors onnxruntime, the `tokenizers`
//! package and sentence-transformers' pooling config give
//! (`tests/python/embeddings_test.py`, within 1e-5), at the coordinator's
//! front door and a worker's.

use crate::util;

use util::cluster::Cluster;

/// The token vectors' output of paraphrase-MiniLM-L3-v2.onnx (its other
/// outputs: the ids and mask passed through, and its own mean).
const TOKEN_VECTORS: &str = "onnx::Shape_422";

/// Pins of the model's last encoder layer and everything after it to
/// `device`: the split copy's second stage.
fn second_stage(model: &std::path::Path, device: &str) -> String {
    let bytes = std::fs::read(model).expect("the model reads");
    let proto = tessera_common::onnx::decode_model_shared(bytes.into()).expect("an ONNX model");
    let nodes = &proto.graph.as_ref().expect("a graph").node;
    let start = nodes
        .iter()
        .position(|n| {
            n.name
                .as_deref()
                .is_some_and(|n| n.contains("/encoder/layer.2/"))
        })
        .expect("a third encoder layer");
    nodes[start..]
        .iter()
        .filter_map(|n| n.name.as_deref())
        .map(|name| format!("{name:?} = {device:?}\n"))
        .collect()
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").port()
}

#[test]
fn minilm_embeddings_equal_onnxruntime_s_on_one_worker_and_split_over_two() {
    let model = util::model("paraphrase-MiniLM-L3-v2.onnx");
    let minilm = util::model("minilm");
    let tokenizer = minilm.join("tokenizer.json");
    let embedding = format!(
        "tokenizer = {:?}\npooling = \"mean\"\nnormalize = true\n",
        tokenizer.display().to_string()
    );
    let port = free_port();
    let config = format!(
        "http_listen = \"127.0.0.1:{port}\"\n\
         [models.minilm]\npath = {path:?}\ndevices = \"HETERO:node-a/CPU\"\nmax_batch = 8\n\
         [models.minilm.embedding]\n{embedding}\
         [models.minilm-split]\npath = {path:?}\ndevices = \"HETERO:node-a/CPU,node-b/CPU\"\n\
         [models.minilm-split.embedding]\n{embedding}\
         [models.minilm-split.affinity]\n{pins}",
        path = model.display().to_string(),
        pins = second_stage(&model, "node-b/CPU"),
    );
    let listen = format!("127.0.0.1:{}", free_port());
    let door: &[&str] = &["--http-listen", &listen];
    let cluster = Cluster::start_configured_with_args(
        "embeddings",
        &[("node-a", "CPU", door), ("node-b", "CPU", &[])],
        1,
        &config,
    );
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/python/embeddings_test.py"
    );
    let runs = [
        (format!("127.0.0.1:{port}"), "minilm"),
        (format!("127.0.0.1:{port}"), "minilm-split"),
        (listen, "minilm"),
    ];
    for (url, name) in runs {
        let out = std::process::Command::new("python3")
            .arg(script)
            .arg(format!("http://{url}/v1"))
            .arg(name)
            .arg(&model)
            .arg(TOKEN_VECTORS)
            .arg(&tokenizer)
            .arg(minilm.join("modules.json"))
            .arg(minilm.join("pooling.json"))
            .output()
            .expect(
                "python3 with openai, onnxruntime and tokenizers (scripts/test.sh installs them)",
            );
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("{name} at {url}:\n{stdout}");
        assert!(
            out.status.success(),
            "embeddings_test.py on {name} at {url} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The split copy is two stages, one on each worker.
    let hosts = util::runtime().block_on(async {
        let client = cluster.client().await;
        let network = client.serving("minilm-split").await.expect("it serves");
        let table = network.routes().expect("a routing table");
        let deployment = table.copies[0].deployment.clone().expect("deployed");
        deployment
            .hosts
            .into_iter()
            .map(|h| h.name)
            .collect::<Vec<_>>()
    });
    assert!(
        hosts.iter().any(|h| h == "node-a") && hosts.iter().any(|h| h == "node-b"),
        "{hosts:?}"
    );
}
