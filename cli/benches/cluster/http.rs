//! The `http` mode: a named model served over HTTP (KServe v2 binary
//! tensors) and over gRPC (KServe v2 `ModelInfer`, raw tensors; tonic's
//! client) vs the Rust SDK on the same embedded cluster.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use tessera_client::Client;
use tessera_serving::grpc::proto;
use tessera_serving::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;

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
        cfg.front_door.http_listen = "127.0.0.1:0".into();
        cfg.front_door.grpc_listen = "127.0.0.1:0".into();
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
    let http = c
        .front_door
        .as_ref()
        .and_then(|d| d.http_addr())
        .context("no HTTP listener")?;
    let url = format!("http://{http}/v2/models/rec/infer");
    let (name, x) = &inputs[0];
    let (head, body) = binary_request(name, x);
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
    let grpc_addr = c.front_door.as_ref().and_then(|d| d.grpc_addr());
    let grpc = grpc_client(grpc_addr.context("no gRPC listener")?).await?;
    let grpc_request = grpc_request(name, x);
    let grpc_reply = grpc_infer(grpc.clone(), grpc_request.clone()).await?;
    anyhow::ensure!(
        grpc_reply.raw_output_contents.first().map(|b| &b[..]) == Some(want),
        "the gRPC answer's raw output differs from the SDK's"
    );
    let (mut sdk, mut over_http, mut over_grpc) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        sdk.push(throughput(&network, &inputs, 160, 16).await?);
        over_grpc.push(grpc_throughput(&grpc, &grpc_request, 160, 16).await?);
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
    let (s, h, g) = (median(sdk), median(over_http), median(over_grpc));
    println!(
        "PP-OCRv4 rec (1x3x48x320), two stages on two workers, 16 in flight: \
         HTTP (KServe v2 binary) {h:.1} req/s, Rust SDK {s:.1} req/s, ratio {:.3} \
         (median of 3, alternating; target >= 0.9)",
        h / s
    );
    println!(
        "  gRPC (KServe v2 ModelInfer, raw tensors, one HTTP/2 connection) {g:.1} req/s, \
         ratio to the SDK {:.3} (target >= 0.95), to HTTP {:.3}",
        g / s,
        g / h
    );
    network.unload().await?;
    c.shutdown().await;
    Ok(())
}

type GrpcClient = GrpcInferenceServiceClient<tonic::transport::Channel>;

/// A gRPC client on one HTTP/2 connection to `addr` (requests multiplex
/// on it, as Triton's clients do).
async fn grpc_client(addr: std::net::SocketAddr) -> Result<GrpcClient> {
    // Receive windows of a few tensors (h2's default is 64 KB: a round trip
    // per 64 KB of rec's 1 MB answer; grpc-core's clients, Triton's Python
    // and C++ ones, grow theirs with the bandwidth-delay product), and 1 MB
    // frames (h2's default is 16 KB).
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .initial_stream_window_size(Some(4 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .max_frame_size(Some(1 << 20))
        .connect()
        .await?;
    Ok(GrpcInferenceServiceClient::new(channel).max_decoding_message_size(64 << 20))
}

/// rec's request with its input as raw contents.
fn grpc_request(name: &str, x: &tessera_common::tensor::Tensor) -> proto::ModelInferRequest {
    proto::ModelInferRequest {
        model_name: "rec".into(),
        inputs: vec![proto::model_infer_request::InferInputTensor {
            name: name.to_string(),
            datatype: "FP32".into(),
            shape: x.shape().iter().map(|&d| d as i64).collect(),
            ..Default::default()
        }],
        raw_input_contents: vec![x.shared_bytes()],
        ..Default::default()
    }
}

async fn grpc_infer(
    mut client: GrpcClient,
    request: proto::ModelInferRequest,
) -> Result<proto::ModelInferResponse> {
    Ok(client.model_infer(request).await?.into_inner())
}

/// Requests per second over gRPC, `in_flight` at a time.
async fn grpc_throughput(
    client: &GrpcClient,
    request: &proto::ModelInferRequest,
    total: usize,
    in_flight: usize,
) -> Result<f64> {
    let started = Instant::now();
    let gate = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut tasks = Vec::with_capacity(total);
    for _ in 0..total {
        let permit = gate.clone().acquire_owned().await?;
        let (client, request) = (client.clone(), request.clone());
        tasks.push(tokio::spawn(async move {
            let r = grpc_infer(client, request).await.map(drop);
            drop(permit);
            r
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// One KServe v2 binary infer request; the response body.
/// A KServe v2 request with input `name` as a binary tensor (float32),
/// asking for binary outputs: its JSON header, and the whole body.
pub(super) fn binary_request(
    name: &str,
    x: &tessera_common::tensor::Tensor,
) -> (String, bytes::Bytes) {
    let head = serde_json::json!({
        "inputs": [{"name": name, "shape": x.shape(), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.bytes().len()}}],
        "parameters": {"binary_data_output": true},
    })
    .to_string();
    let mut body = head.clone().into_bytes();
    body.extend_from_slice(x.bytes());
    (head, bytes::Bytes::from(body))
}

pub(super) async fn http_infer(
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
