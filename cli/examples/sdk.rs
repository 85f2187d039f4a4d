//! The client SDK end to end, runnable on one machine:
//! `cargo run --example sdk -p tessera-cli`.
//!
//! Starts an embedded local cluster (a coordinator and two workers in this
//! process, QUIC with throw-away mutual-TLS certificates on loopback),
//! then, through `tessera_client` exactly as against a remote cluster:
//! loads the bundled small CNN split over the two workers, prints the plan,
//! runs one request from an `ndarray` array, then 32 pipelined requests
//! whose results come back in order, and unloads.

use std::time::Instant;

use tessera_client::{tensor, Client, LoadOptions};

fn main() -> anyhow::Result<()> {
    tessera_cli::cluster::run_system(async {
        let cluster = tessera_cli::cluster::start(2, &["CPU".to_string()], &[]).await?;
        let client =
            Client::connect(cluster.addr, &cluster.client, tessera_cli::cluster::CLUSTER).await?;

        let model = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/models/small_cnn.onnx"
        ))?;
        let second_half = ["conv3", "relu3", "gap", "flatten", "fc", "softmax"];
        let options = LoadOptions {
            devices: "HETERO:node-a/CPU,node-b/CPU".into(),
            affinity: second_half
                .iter()
                .map(|n| (n.to_string(), "node-b/CPU".to_string()))
                .collect(),
            ..Default::default()
        };
        let network = client
            .load_network_with_progress(model, options, |what, done, total| {
                println!("  [{done}/{total}] {what}")
            })
            .await?;
        for sg in &network.plan().subgraphs {
            println!(
                "subgraph {} on {}: {} nodes, predicted {:.0} µs",
                sg.id,
                sg.device,
                sg.nodes.len(),
                sg.predicted_compute_us
            );
        }

        let image = ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(&[1, 3, 64, 64]), |i| {
            ((i[1] * 64 + i[2] + i[3]) % 17) as f32 / 17.0
        });
        let outputs = network
            .infer(vec![("image".into(), tensor::from_array(&image)?)])
            .await?;
        let probs: ndarray::ArrayD<f32> = tensor::to_array(&outputs.tensors[0].1)?;
        println!("probs {:?}, sum {:.4}", probs.shape(), probs.sum());

        let batch: Vec<_> = (0..32)
            .map(|k| {
                let x = image.mapv(|v| v * (1.0 + k as f32 / 32.0));
                tensor::from_array(&x).map(|t| vec![("image".to_string(), t)])
            })
            .collect::<Result<_, _>>()?;
        let started = Instant::now();
        let results = network.infer_many(batch).await;
        let ok = results.iter().filter(|r| r.is_ok()).count();
        println!(
            "{ok}/32 pipelined requests in {:.1} ms, results in order",
            started.elapsed().as_secs_f64() * 1e3
        );
        network.unload().await?;
        cluster.shutdown().await;
        Ok(())
    })
}
