//! Text generation (`generate`), SmolLM2-135M-Instruct in float32
//! (`scripts/fetch-llm.sh`), greedy, single-threaded workers:
//! - one sequence on one worker vs onnxruntime-genai on the same folder
//!   and one thread (its tokens/s after the first token, and the time to
//!   the first token);
//! - the same sequence over two workers split by memory: what each stage
//!   hop adds per token;
//! - 8 concurrent sequences on the two-worker pipeline vs one worker,
//!   against the machine's no-network ceiling (two onnxruntime-genai
//!   processes at once vs one), and what continuous batching gains (8 at
//!   once on one worker vs one alone);
//! - the state one sequence keeps per stage;
//! - the 4-bit folder (MatMulNBits) vs the float32 one, one sequence.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use tessera_cli::cluster::{start_workers, Embedded};
use tessera_client::generate::{GenerateParams, GenerateStats, ModelFolder, Prompt};
use tessera_client::{Client, LoadOptions, Network};
use tessera_common::memory::format_size;

use super::memory::spec;
use super::model_path;

const NEW_TOKENS: u32 = 32;
const PROMPT: &str = "Once upon a time";
const CONTEXT: u32 = 512;
const SEQUENCES: u32 = 8;
const FP32: &str = "smollm2-135m-instruct";
/// Its Q4_1 linear weights kept 4-bit (MatMulNBits).
const Q4: &str = "smollm2-135m-instruct-q4";

/// onnxruntime-genai on one thread per process, `processes` at once, each
/// generating one sequence or (`batch` > 0) a batch of `batch`: the
/// tokens/s of each (after the first token) and its first-token time.
fn genai(processes: usize, batch: usize) -> Result<Vec<(f64, f64)>> {
    genai_on(FP32, processes, batch)
}

/// [`genai`] on model folder `name`.
fn genai_on(name: &str, processes: usize, batch: usize) -> Result<Vec<(f64, f64)>> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/llm/genai_generate.py"
    );
    let folder = model_path(name);
    let children: Vec<_> = (0..processes)
        .map(|_| {
            Command::new("python3")
                .arg(script)
                .arg(&folder)
                .args([
                    "--threads",
                    "1",
                    "--max-new",
                    &NEW_TOKENS.to_string(),
                    "--batch",
                    &batch.to_string(),
                    PROMPT,
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
        })
        .collect::<std::io::Result<_>>()
        .context("python3 with onnxruntime-genai")?;
    children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output()?;
            anyhow::ensure!(out.status.success(), "onnxruntime-genai failed");
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            Ok((
                v["tokens_per_s"].as_f64().unwrap_or(0.0),
                v["first_token_s"].as_f64().unwrap_or(0.0),
            ))
        })
        .collect()
}

async fn load(cluster: &Embedded) -> Result<(Client, Network)> {
    load_folder(cluster, FP32).await
}

async fn load_folder(cluster: &Embedded, name: &str) -> Result<(Client, Network)> {
    let client =
        Client::connect(cluster.addr, &cluster.client, tessera_cli::cluster::CLUSTER).await?;
    let mut folder = ModelFolder::read(&model_path(name), SEQUENCES)?;
    folder.generation.context_length = CONTEXT;
    let options = LoadOptions {
        devices: "CPU".into(),
        generation: Some(folder.generation),
        ..Default::default()
    };
    let network = client.load_network(folder.model, options).await?;
    Ok((client, network))
}

async fn generate(network: &Network, prompt: &str) -> Result<GenerateStats> {
    let params = GenerateParams {
        max_tokens: NEW_TOKENS,
        ..GenerateParams::default()
    };
    let generation = network
        .generate(Prompt::Text(prompt.into()), params)
        .await?;
    Ok(generation.collect().await?.2)
}

/// Tokens/s after the first token.
fn decode_rate(s: &GenerateStats) -> f64 {
    let secs = s.total_us.saturating_sub(s.first_token_us) as f64 / 1e6;
    f64::from(s.generated_tokens.saturating_sub(1)) / secs.max(1e-9)
}

/// Aggregate tokens/s of `SEQUENCES` generations at once.
async fn concurrent(network: &Network) -> Result<f64> {
    let started = Instant::now();
    let runs = (0..SEQUENCES).map(|i| {
        let network = network.clone();
        async move { generate(&network, &format!("{PROMPT} there were {i} cats")).await }
    });
    let stats = futures_util::future::join_all(runs).await;
    let tokens: u32 = stats
        .into_iter()
        .map(|s| s.map(|s| s.generated_tokens))
        .sum::<Result<u32>>()?;
    Ok(f64::from(tokens) / started.elapsed().as_secs_f64())
}

pub async fn generation() -> Result<()> {
    let one = start_workers(&[spec(None)?], |_| {}).await?;
    let two = start_workers(&[spec(Some("420MiB"))?, spec(Some("420MiB"))?], |_| {}).await?;
    let (_c1, whole) = load(&one).await?;
    let (_c2, split) = load(&two).await?;
    for sg in &split.plan().subgraphs {
        println!(
            "stage {} on {}: {} nodes, weights {}, state {} ({} per sequence at {CONTEXT} positions)",
            sg.id,
            sg.device,
            sg.nodes.len(),
            format_size(sg.memory.weights),
            format_size(sg.memory.state),
            format_size(sg.memory.state / u64::from(SEQUENCES)),
        );
    }
    generate(&whole, PROMPT).await?;
    generate(&split, PROMPT).await?;
    let reference = genai(1, 0)?[0];
    let s1 = generate(&whole, PROMPT).await?;
    let s2 = generate(&split, PROMPT).await?;
    let (r1, r2) = (decode_rate(&s1), decode_rate(&s2));
    println!(
        "one sequence, {NEW_TOKENS} new tokens, one thread: onnxruntime-genai {:.1} tokens/s \
         (first token {:.1} ms); Tessera on one worker {r1:.1} tokens/s (first token {:.1} ms): \
         {:.2} of onnxruntime-genai",
        reference.0,
        reference.1 * 1e3,
        s1.first_token_us as f64 / 1e3,
        r1 / reference.0
    );
    println!(
        "over two workers {r2:.1} tokens/s (first token {:.1} ms): each extra stage hop adds \
         {:.0} µs per token",
        s2.first_token_us as f64 / 1e3,
        (1.0 / r2 - 1.0 / r1) * 1e6
    );
    let c2 = concurrent(&split).await?;
    let c1 = concurrent(&whole).await?;
    // The machine's own ceiling for the pipeline: two processes with half
    // the sequences each at once vs one with them all.
    let half = SEQUENCES as usize / 2;
    let pair: f64 = genai(2, half)?.iter().map(|p| p.0).sum();
    let batched = genai(1, SEQUENCES as usize)?[0].0;
    let ceiling = pair / batched;
    println!(
        "{SEQUENCES} sequences at once: two-worker pipeline {c2:.1} tokens/s, one worker {c1:.1} \
         tokens/s: {:.2}x; the no-network ceiling (two onnxruntime-genai processes with batches \
         of {half} at once vs one with a batch of {SEQUENCES}) {ceiling:.2}x, so {:.2} of it",
        c2 / c1,
        c2 / c1 / ceiling
    );
    println!(
        "continuous batching: {SEQUENCES} sequences at once on one worker {c1:.1} tokens/s ({:.2}x \
         one sequence alone); onnxruntime-genai with a batch of {SEQUENCES} (equal prompts, \
         started together) {batched:.1} tokens/s: {:.2} of it",
        c1 / r1,
        c1 / batched
    );
    split.unload().await?;
    four_bit(&one, &whole, r1).await?;
    whole.unload().await?;
    one.shutdown().await;
    two.shutdown().await;
    Ok(())
}

/// The 4-bit folder on the one-worker cluster vs the float32 one (whose
/// single-sequence rate was `r1`), each also against onnxruntime-genai.
async fn four_bit(one: &Embedded, whole: &Network, r1: f64) -> Result<()> {
    let (_c, q4) = load_folder(one, Q4).await?;
    generate(&q4, PROMPT).await?;
    let s = generate(&q4, PROMPT).await?;
    let rate = decode_rate(&s);
    let g32 = genai_on(FP32, 1, 0)?[0].0;
    let g4 = genai_on(Q4, 1, 0)?[0].0;
    let again = decode_rate(&generate(whole, PROMPT).await?);
    println!(
        "4-bit weights (MatMulNBits, int8 activations): one sequence on one worker {rate:.1} \
         tokens/s vs float32 {:.1} ({:.2}x); onnxruntime-genai {g4:.1} vs {g32:.1} ({:.2}x); \
         Tessera 4-bit {:.2} of onnxruntime-genai 4-bit",
        (r1 + again) / 2.0,
        rate * 2.0 / (r1 + again),
        g4 / g32,
        rate / g4
    );
    q4.unload().await?;
    Ok(())
}
