//! The `embeddings` mode: MiniLM (the corpus' paraphrase-MiniLM-L3-v2)
//! served as sentence embeddings through `POST /v1/embeddings` on an
//! embedded one-worker cluster (1 thread) vs onnxruntime in one process
//! on 1 thread (`ort_embeddings.py`: the same tokenizer, padding and mean
//! pooling), batches of 1 and of 32, alternating, best of 3, in one run.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use tessera_cli::cluster::start_workers;
use tessera_client::{Client, LoadOptions};
use tessera_common::models::EmbeddingConfig;
use tessera_common::wire::embed::Pooling;

use super::memory::spec;
use super::model_path;

const MODEL: &str = "paraphrase-MiniLM-L3-v2.onnx";
const TOKENIZER: &str = "minilm/tokenizer.json";
/// Requests of one text per round; requests of 32 per round.
const SINGLES: usize = 64;
const BATCHES: usize = 8;

/// 32 sentences of 6 to 14 words.
fn texts() -> Vec<String> {
    let words = [
        "the", "model", "splits", "over", "machines", "and", "each", "worker", "runs", "its",
        "stage", "while", "requests", "stream", "through", "them",
    ];
    (0..32)
        .map(|i| {
            (0..6 + i % 9)
                .map(|j| words[(i * 7 + j * 3) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// onnxruntime's embeddings/s at batches of 1 and 32, one thread.
fn onnxruntime() -> Result<(f64, f64)> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/cluster/ort_embeddings.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .arg(model_path(MODEL))
        .arg(model_path(TOKENIZER))
        .arg(serde_json::to_string(&texts())?)
        .args([SINGLES.to_string(), BATCHES.to_string()])
        .output()
        .context("python3 with onnxruntime and tokenizers")?;
    anyhow::ensure!(
        out.status.success(),
        "ort_embeddings.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok((
        v["batch_1"].as_f64().unwrap_or(0.0),
        v["batch_32"].as_f64().unwrap_or(0.0),
    ))
}

/// Tessera's embeddings/s over HTTP: `SINGLES` requests of one text, then
/// `BATCHES` of 32.
async fn tessera(web: &reqwest::Client, url: &str) -> Result<(f64, f64)> {
    let texts = texts();
    let post = |input: serde_json::Value| {
        let body = serde_json::json!({ "model": "minilm", "input": input });
        let request = web
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send();
        async move {
            let reply = request.await?.error_for_status()?;
            let v: serde_json::Value = serde_json::from_slice(&reply.bytes().await?)?;
            anyhow::Ok(v["data"].as_array().map_or(0, Vec::len))
        }
    };
    let started = Instant::now();
    for i in 0..SINGLES {
        post(serde_json::json!(texts[i % texts.len()])).await?;
    }
    let singles = SINGLES as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    for _ in 0..BATCHES {
        let n = post(serde_json::json!(texts)).await?;
        anyhow::ensure!(n == texts.len(), "{n} vectors for {} texts", texts.len());
    }
    let batched = (BATCHES * texts.len()) as f64 / started.elapsed().as_secs_f64();
    Ok((singles, batched))
}

pub async fn embeddings() -> Result<()> {
    if !model_path(TOKENIZER).exists() {
        println!("embeddings: skipped (run scripts/fetch-test-models.sh)");
        return Ok(());
    }
    let one = start_workers(&[spec(None)?], |cfg| {
        cfg.front_door.http_listen = "127.0.0.1:0".into()
    })
    .await?;
    let client = Client::connect(one.addr, &one.client, tessera_cli::cluster::CLUSTER).await?;
    let config = EmbeddingConfig {
        tokenizer: model_path(TOKENIZER),
        pooling: Pooling::Mean,
        normalize: true,
        max_length: 0,
        output: String::new(),
    };
    let tokenizer = std::fs::read_to_string(&config.tokenizer)?;
    let options = LoadOptions {
        devices: "CPU".into(),
        embedding: Some(config.spec().with_tokenizer(tokenizer)),
        ..Default::default()
    };
    let bytes = std::fs::read(model_path(MODEL))?;
    client
        .load_model("minilm", bytes::Bytes::from(bytes), options, |_, _, _| {})
        .await?;
    let http = one
        .front_door
        .as_ref()
        .and_then(|d| d.http_addr())
        .context("no HTTP listener")?;
    let url = format!("http://{http}/v1/embeddings");
    let web = reqwest::Client::new();
    tessera(&web, &url).await?;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        ours.push(tessera(&web, &url).await?);
        theirs.push(onnxruntime()?);
    }
    let best =
        |v: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| v.iter().map(pick).fold(0.0, f64::max);
    for (what, pick) in [
        ("batch 1", (|p: &(f64, f64)| p.0) as fn(&(f64, f64)) -> f64),
        ("batch 32", |p| p.1),
    ] {
        let (t, o) = (best(&ours, pick), best(&theirs, pick));
        println!(
            "MiniLM embeddings/s, 1 thread, {what}: Tessera over HTTP {t:.1} vs onnxruntime in one process {o:.1}: {:.2}",
            t / o
        );
    }
    one.shutdown().await;
    Ok(())
}
