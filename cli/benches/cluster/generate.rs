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
//! - the 4-bit folder (MatMulNBits) vs the float32 one, one sequence;
//! - the bytes the requester receives per generated token (target ≤ 64);
//! - a ~1,000-token prompt's time to the first token vs onnxruntime-genai
//!   (target ≤ 1.05).

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
/// Room for the ~1,000-token prompt.
const LONG_CONTEXT: u32 = 1152;
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
    genai_run(name, processes, batch, PROMPT, NEW_TOKENS)
}

/// [`genai_on`] with its own prompt and number of new tokens.
fn genai_run(
    name: &str,
    processes: usize,
    batch: usize,
    prompt: &str,
    new_tokens: u32,
) -> Result<Vec<(f64, f64)>> {
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
                    &new_tokens.to_string(),
                    "--batch",
                    &batch.to_string(),
                    prompt,
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
    generate_n(network, prompt, NEW_TOKENS).await
}

async fn generate_n(network: &Network, prompt: &str, max_tokens: u32) -> Result<GenerateStats> {
    let params = GenerateParams {
        max_tokens,
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
    Ok(concurrent_counted(network).await?.whole)
}

/// `SEQUENCES` generations at once: their aggregate tokens/s over the
/// whole run (prompts included), their summed rates after each one's
/// first token, and the tokens generated.
struct Concurrent {
    whole: f64,
    decode: f64,
    tokens: u32,
}

async fn concurrent_counted(network: &Network) -> Result<Concurrent> {
    let started = Instant::now();
    let runs = (0..SEQUENCES).map(|i| {
        let network = network.clone();
        async move { generate(&network, &format!("{PROMPT} there were {i} cats")).await }
    });
    let stats = futures_util::future::join_all(runs)
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let tokens: u32 = stats.iter().map(|s| s.generated_tokens).sum();
    Ok(Concurrent {
        whole: f64::from(tokens) / started.elapsed().as_secs_f64(),
        decode: stats.iter().map(decode_rate).sum(),
        tokens,
    })
}

/// onnxruntime-genai's batch of `batch` from its (tokens/s after the
/// first token, seconds to the first): its tokens/s over the whole run.
fn genai_whole_rate((decode, first): (f64, f64), batch: usize) -> f64 {
    let tokens = f64::from(NEW_TOKENS) * batch as f64;
    let rest = (tokens - batch as f64) / decode.max(1e-9);
    tokens / (first + rest)
}

/// What the requester receives from the workers per generated token: its
/// frames (token ids and replies), and its QUIC datagrams whole
/// (headers, acknowledgements), one sequence and `SEQUENCES` at once.
async fn bytes_per_token(client: &Client, network: &Network) -> Result<()> {
    let (app, udp) = client.data_received().await;
    let s = generate(network, PROMPT).await?;
    let (app1, udp1) = client.data_received().await;
    let tokens = concurrent_counted(network).await?.tokens;
    let (app8, udp8) = client.data_received().await;
    let per = |bytes: u64, n: u32| bytes as f64 / f64::from(n.max(1));
    println!(
        "bytes into the requester per generated token (the stage with the logits samples): one \
         sequence {:.0} of frames, {:.0} on the wire (QUIC datagrams whole); {SEQUENCES} at \
         once {:.0} and {:.0}",
        per(app1 - app, s.generated_tokens),
        per(udp1 - udp, s.generated_tokens),
        per(app8 - app1, tokens),
        per(udp8 - udp1, tokens),
    );
    Ok(())
}

/// A prompt of about 1,000 tokens (plain prose, repeated).
fn long_prompt() -> String {
    let paragraph = "The old lighthouse keeper climbed the spiral stairs every evening, \
        counting the steps as his father had taught him, and lit the lamp that warned \
        the fishing boats away from the rocks below the cliffs. ";
    paragraph.repeat(24)
}

/// The time to the first token of a ~1,000-token prompt on one
/// single-threaded worker vs onnxruntime-genai on one thread, on the same
/// folder (median of 3, alternating).
async fn long_prompt_first_token(one: &Embedded) -> Result<()> {
    let client = Client::connect(one.addr, &one.client, tessera_cli::cluster::CLUSTER).await?;
    let mut folder = ModelFolder::read(&model_path(FP32), 1)?;
    folder.generation.context_length = LONG_CONTEXT;
    let options = LoadOptions {
        devices: "CPU".into(),
        generation: Some(folder.generation),
        ..Default::default()
    };
    let network = client.load_network(folder.model, options).await?;
    let prompt = long_prompt();
    let warm = generate_n(&network, &prompt, 2).await?;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        ours.push(generate_n(&network, &prompt, 2).await?.first_token_us as f64 / 1e6);
        theirs.push(genai_run(FP32, 1, 0, &prompt, 2)?[0].1);
    }
    let (t, g) = (super::median(ours), super::median(theirs));
    println!(
        "a {}-token prompt's first token, one thread: Tessera on one worker {t:.2} s, \
         onnxruntime-genai {g:.2} s: {:.2}x (median of 3, alternating)",
        warm.prompt_tokens,
        t / g
    );
    network.unload().await?;
    Ok(())
}

pub async fn generation() -> Result<()> {
    let one = start_workers(&[spec(None)?], |_| {}).await?;
    let two = start_workers(&[spec(Some("420MiB"))?, spec(Some("420MiB"))?], |_| {}).await?;
    let (c1, whole) = load(&one).await?;
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
    bytes_per_token(&c1, &whole).await?;
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
    let counted = concurrent_counted(&whole).await?;
    let c1 = counted.whole;
    // The machine's own ceiling for the pipeline: two processes with half
    // the sequences each at once vs one with them all.
    let half = SEQUENCES as usize / 2;
    let pair: f64 = genai(2, half)?.iter().map(|p| p.0).sum();
    let batch8 = genai(1, SEQUENCES as usize)?[0];
    let batched = batch8.0;
    let batched_whole = genai_whole_rate(batch8, SEQUENCES as usize);
    let ceiling = pair / batched;
    println!(
        "{SEQUENCES} sequences at once: two-worker pipeline {c2:.1} tokens/s, one worker {c1:.1} \
         tokens/s: {:.2}x; the no-network ceiling (two onnxruntime-genai processes with batches \
         of {half} at once vs one with a batch of {SEQUENCES}) {ceiling:.2}x, so {:.2} of it",
        c2 / c1,
        c2 / c1 / ceiling
    );
    println!(
        "continuous batching: {SEQUENCES} sequences at once on one worker {c1:.1} tokens/s over \
         the whole run, prompts included ({:.2}x one sequence alone), {:.1} after each one's \
         first token; onnxruntime-genai with a batch of {SEQUENCES} (equal prompts, started \
         together) {batched_whole:.1} and {batched:.1}: {:.2} and {:.2} of it",
        c1 / r1,
        counted.decode,
        c1 / batched_whole,
        counted.decode / batched
    );
    split.unload().await?;
    four_bit(&one, &whole, r1).await?;
    whole.unload().await?;
    long_prompt_first_token(&one).await?;
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
