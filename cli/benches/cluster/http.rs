//! The `http` mode: a named model served over HTTP (KServe v2 binary
//! tensors) vs the Rust SDK on the same embedded cluster.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use tessera_client::Client;

use super::{halves, median, rec, split_options, throughput};

/// rec's two stages as the named model `rec` of a two-worker cluster
/// with an HTTP listener: KServe v2 binary requests vs the SDK.
pub async fn http_vs_sdk() -> Result<()> {
    let Some((bytes, graph, inputs)) = rec()? else {
        return Ok(());
    };
    let halves = halves(&graph, &inputs)?;
    let config = vec![("NUM_THREADS".to_string(), "1".to_string())];
    let c = tessera_cli::cluster::start_configured(2, &["CPU".to_string()], &config, |cfg| {
        cfg.http_listen = "127.0.0.1:0".into();
    })
    .await?;
    let client = Client::connect(c.addr, &c.client, tessera_cli::cluster::CLUSTER).await?;
    let network = client
        .load_model(
            "rec",
            bytes,
            split_options(&halves, "node-a/CPU", "node-b/CPU"),
            |_, _, _| {},
        )
        .await?;
    let http = c.coordinator.http_addr().context("no HTTP listener")?;
    let url = format!("http://{http}/v2/models/rec/infer");
    let (name, x) = &inputs[0];
    let head = serde_json::json!({
        "inputs": [{"name": name, "shape": x.shape(), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.bytes().len()}}],
        "parameters": {"binary_data_output": true},
    })
    .to_string();
    let mut body = head.clone().into_bytes();
    body.extend_from_slice(x.bytes());
    let body = bytes::Bytes::from(body);
    let web = reqwest::Client::builder()
        .pool_max_idle_per_host(32)
        .build()?;
    // Warm-up and a check that HTTP answers what the SDK answers.
    let sdk_out = network.infer(inputs.clone()).await?;
    let reply = http_infer(&web, &url, &head, &body).await?;
    let want = sdk_out.tensors[0].1.bytes();
    anyhow::ensure!(
        reply.ends_with(want),
        "the HTTP answer's binary output differs from the SDK's"
    );
    let (mut sdk, mut over_http) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        sdk.push(throughput(&network, &inputs, 160, 16).await?);
        let started = Instant::now();
        let gate = Arc::new(tokio::sync::Semaphore::new(16));
        let mut tasks = Vec::new();
        for _ in 0..160 {
            let permit = gate.clone().acquire_owned().await?;
            let (web, url, head, body) = (web.clone(), url.clone(), head.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                let r = http_infer(&web, &url, &head, &body).await.map(drop);
                drop(permit);
                r
            }));
        }
        for t in tasks {
            t.await??;
        }
        over_http.push(160.0 / started.elapsed().as_secs_f64());
    }
    let (s, h) = (median(sdk), median(over_http));
    println!(
        "PP-OCRv4 rec (1x3x48x320), two stages on two workers, 16 in flight: \
         HTTP (KServe v2 binary) {h:.1} req/s, Rust SDK {s:.1} req/s, ratio {:.3} \
         (median of 3, alternating; target >= 0.9)",
        h / s
    );
    network.unload().await?;
    c.coordinator.shutdown().await;
    Ok(())
}

/// One KServe v2 binary infer request; the response body.
async fn http_infer(
    web: &reqwest::Client,
    url: &str,
    head: &str,
    body: &bytes::Bytes,
) -> Result<bytes::Bytes> {
    let reply = web
        .post(url)
        .header("Inference-Header-Content-Length", head.len())
        .header("Content-Type", "application/octet-stream")
        .body(body.clone())
        .send()
        .await?;
    let status = reply.status();
    let bytes = reply.bytes().await?;
    anyhow::ensure!(
        status.is_success(),
        "HTTP {status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    Ok(bytes)
}
