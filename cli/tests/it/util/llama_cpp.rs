//! llama.cpp as the reference of the GGUF tests: its own tools
//! (`llama-quantize`, our `llama-ref` driver, built by
//! `scripts/llama-cpp.sh`), seeded random GGUFs (`write_gguf.py`), and the
//! comparison of Tessera's logits, greedy tokens and token ids with
//! llama.cpp's on real worker processes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tessera_client::generate::{GenerateParams, Prompt};
use tessera_client::{Client, LoadOptions, Network};
use tessera_common::tensor::{read_npy, Tensor};
use tessera_gguf::BuildOptions;

/// Logits within this much of the largest magnitude.
pub const TOLERANCE: f32 = 1e-3;
/// Cached steps whose logits are compared; greedy tokens compared.
pub const STEPS: usize = 16;
pub const GREEDY: usize = 32;

/// One cluster at a time: two cores.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A command's stdout; the test fails with its stderr if it fails.
pub fn output(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the command runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// llama.cpp's `llama-quantize` and our `llama-ref`, built once.
pub fn llama_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let script = repo().join("scripts/llama-cpp.sh");
        let out = output(Command::new(script).args(["llama-quantize", "llama-ref"]));
        PathBuf::from(out.lines().last().expect("the bin folder").trim())
    })
}

/// A seeded random llama GGUF (`write_gguf.py` with `args`).
pub fn write_gguf(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
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
pub fn quantized(base: &Path, ty: &str) -> (PathBuf, PathBuf) {
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
pub struct Reference {
    pub prompt: Vec<Vec<f32>>,
    pub steps: Vec<Vec<f32>>,
    pub greedy: Vec<u32>,
    /// Each prompt token alone at position 0.
    pub single: Vec<Vec<f32>>,
}

pub fn rows(path: &Path) -> Vec<Vec<f32>> {
    let t = read_npy(&std::fs::read(path).expect("an .npy")).expect("a float32 .npy");
    let width = t.shape()[1];
    let values = t.float_values().expect("float32");
    values.chunks(width).map(<[f32]>::to_vec).collect()
}

pub fn llama_eval(model: &Path, tokens: &[u32], out: &Path) -> Reference {
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
        single: rows(&out.join("single_logits.npy")),
        greedy: greedy["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|t| t.as_u64().expect("an id") as u32)
            .collect(),
    }
}

/// llama.cpp's token ids of each text (special tokens added and parsed).
pub fn llama_tokenize(model: &Path, texts: &[String]) -> Vec<Vec<u32>> {
    tokenize(model, texts, true)
}

/// llama.cpp's token ids of a text, special tokens parsed but none added
/// (a chat template's text has its own).
pub fn llama_tokenize_plain(model: &Path, text: &str) -> Vec<u32> {
    tokenize(model, &[text.to_string()], false).remove(0)
}

fn tokenize(model: &Path, texts: &[String], add_special: bool) -> Vec<Vec<u32>> {
    let mut cmd = Command::new(llama_bin().join("llama-ref"));
    cmd.arg("tokenize").arg(model);
    if !add_special {
        cmd.arg("--no-special");
    }
    json_through(&mut cmd, &serde_json::json!(texts))
}

/// `cmd`'s stdout as JSON, `input` written to its stdin; the test fails
/// if it fails.
pub fn json_through<T: serde::de::DeserializeOwned>(
    cmd: &mut Command,
    input: &serde_json::Value,
) -> T {
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?} runs: {e}"));
    use std::io::Write as _;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.to_string().as_bytes())
        .expect("input written");
    let out = child.wait_with_output().expect("the command ends");
    assert!(out.status.success(), "{cmd:?} failed");
    serde_json::from_slice(&out.stdout).expect("JSON out")
}

/// The decoder's cache shape: layers, key/value heads, head size.
#[derive(Clone, Copy)]
pub struct Shape {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

pub const DEFAULT_SHAPE: Shape = Shape {
    layers: 2,
    kv_heads: 2,
    head_dim: 64,
};

/// Tessera's logits on `network` (the model loaded without generation:
/// stateless requests, the cache fed back by the test): each prompt
/// position from a fresh run over its prefix, then `STEPS` greedy steps
/// through the cache; and the tokens those steps picked.
pub async fn tessera_logits(
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
    let (mut prompt, mut single) = (Vec::new(), Vec::new());
    for end in 1..=tokens.len() {
        prompt.push(step(&tokens[..end], 0, empty()).await.0);
        single.push(step(&tokens[end - 1..end], 0, empty()).await.0);
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
        single,
    }
}

pub fn argmax(logits: &[f32]) -> u32 {
    (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .expect("logits") as u32
}

/// Rows and their largest |got − want| as a share of the row's largest
/// |logit|, and the reference's top-2 margin as such a share.
pub fn differences(got: &[Vec<f32>], want: &[Vec<f32>]) -> Vec<(f32, f32)> {
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
/// except where float32 sums taken in another order (a norm's, an
/// exponential's, a dot product's) leave an activation on the other side
/// of a rounding tie: one 8-bit step, up to a few hundredths of the
/// largest logit in these random models (llama.cpp is itself 2.5–5.5%
/// from exact arithmetic, so a kernel that rounds otherwise is off by
/// about that everywhere). A tie at one position reaches every later one
/// through attention, and a router choosing between experts can take the
/// other expert. So: each prompt token alone (no other position's tie
/// reaches it) within 1e-5 for at least half of them and within 5e-2 for
/// all; every row of the prompt and the steps within twice that; and the
/// most likely token the same wherever llama.cpp's margin between its
/// first two exceeds the row's bound. Returns the median difference of
/// the tokens alone, and how many of them and of the prompt's and steps'
/// rows a tie moved.
pub fn assert_rounded(what: &str, got: &Reference, want: &Reference) -> (f32, usize, usize) {
    const EXACT: f32 = 1e-5;
    const TIE: f32 = 5e-2;
    let check = |rows: &[Vec<f32>], reference: &[Vec<f32>], bound: f32, part: &str| {
        let diffs = differences(rows, reference);
        for (i, (&(diff, margin), (g, w))) in
            diffs.iter().zip(rows.iter().zip(reference)).enumerate()
        {
            assert!(
                diff <= bound,
                "{what} {part} row {i}: logits {diff:.2e} of the largest from llama.cpp's"
            );
            if margin > bound {
                assert_eq!(
                    argmax(g),
                    argmax(w),
                    "{what} {part} row {i}: the most likely token"
                );
            }
        }
        diffs.iter().map(|d| d.0).collect::<Vec<f32>>()
    };
    let mut alone = check(&got.single, &want.single, TIE, "alone");
    let carried: Vec<f32> = [
        check(&got.prompt, &want.prompt, 2.0 * TIE, "prompt"),
        check(&got.steps, &want.steps, 2.0 * TIE, "step"),
    ]
    .concat();
    alone.sort_by(f32::total_cmp);
    let median = alone[alone.len() / 2];
    assert!(
        median <= EXACT,
        "{what}: the median token alone is {median:.2e} from llama.cpp's ({alone:?})"
    );
    let moved = |d: &[f32]| d.iter().filter(|&&d| d > EXACT).count();
    (median, moved(&alone), moved(&carried))
}

/// Each token Tessera generated (after `prompt`) is one llama.cpp would
/// pick given the same tokens before it, up to a rounding tie (its logit
/// within 5e-2 of the largest of the row's largest); returns how many are
/// llama.cpp's very choice.
pub fn greedy_within_ties(
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
pub fn assert_logits(what: &str, got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
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

/// Where a model runs.
#[derive(Clone, Copy)]
pub enum Placement<'a> {
    /// On these devices, by priority (`CPU`, `HETERO:node-a/CPU,…`).
    On(&'a str),
    /// The first half of the layers on the first worker's CPU, the rest
    /// and the head on the second's (manual affinity by layer).
    Halves(&'a str, &'a str),
}

/// `gguf` built with `options`, loaded where `placement` says as a
/// stateless network, or as a generative one (a context of 512).
pub async fn load(
    client: &Client,
    (gguf, options): (&Path, &BuildOptions),
    placement: Placement<'_>,
    generative: bool,
) -> Network {
    let read = tessera_gguf::generative::read_with(gguf, 1, options).expect("the GGUF reads");
    let mut spec = read.spec;
    spec.context_length = 512;
    let (devices, affinity) = match placement {
        Placement::On(devices) => (devices.to_string(), Vec::new()),
        Placement::Halves(a, b) => (
            format!("HETERO:{a}/CPU,{b}/CPU"),
            second_half(
                &tessera_common::onnx::decode_model_shared(read.model.clone()).expect("a model"),
                &format!("{b}/CPU"),
            ),
        ),
    };
    let options = LoadOptions {
        // Its path: a worker that may read it there builds it itself.
        name: gguf.display().to_string(),
        devices,
        affinity,
        generation: generative.then_some(spec),
        ..Default::default()
    };
    client
        .load_network(read.model, options)
        .await
        .expect("the GGUF loads")
}

/// Every node of the second half of a decoder's layers, and of its head,
/// to `device`.
fn second_half(
    model: &tessera_common::onnx::proto::ModelProto,
    device: &str,
) -> Vec<(String, String)> {
    let layer = |name: &str| -> Option<usize> {
        name.strip_prefix("/model/layers.")?
            .split('/')
            .next()?
            .parse()
            .ok()
    };
    let nodes = &model.graph.as_ref().expect("a graph").node;
    let layers = nodes
        .iter()
        .filter_map(|n| layer(n.name.as_deref()?))
        .max()
        .expect("layers")
        + 1;
    nodes
        .iter()
        .filter_map(|n| n.name.clone())
        .filter(|name| {
            layer(name).is_some_and(|l| l >= layers / 2)
                || name.starts_with("/model/norm")
                || name.starts_with("/lm_head")
        })
        .map(|name| (name, device.to_string()))
        .collect()
}

pub fn greedy(max_tokens: u32) -> GenerateParams {
    GenerateParams {
        max_tokens,
        ..GenerateParams::default()
    }
}

/// The prompt's ids as llama.cpp tokenizes it.
pub fn prompt_ids(gguf: &Path, prompt: &str) -> Vec<u32> {
    llama_tokenize(gguf, &[prompt.to_string()]).remove(0)
}

/// How a case is checked: the file Tessera reads and how it builds it,
/// and the file llama.cpp runs (the same, or its float32 copy).
pub struct Case<'a> {
    pub gguf: &'a Path,
    pub options: BuildOptions,
    pub reference: &'a Path,
    /// Both round activations to 8 bits (see [`assert_rounded`]).
    pub rounded: bool,
}

impl<'a> Case<'a> {
    /// Float32 activations against llama.cpp on the file's float32 copy.
    pub fn exact((gguf, dequantized): (&'a Path, &'a Path)) -> Case<'a> {
        Case {
            gguf,
            options: BuildOptions::portable(true),
            reference: dequantized,
            rounded: false,
        }
    }

    /// Tessera's kernels against llama.cpp on the file itself.
    pub fn kernels(gguf: &'a Path) -> Case<'a> {
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
pub async fn check_against_llama_cpp(
    client: &Client,
    case: Case<'_>,
    prompt: &str,
    (shape, placement): (Shape, Placement<'_>),
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
    let stateless = load(client, (gguf, &options), placement, false).await;
    // Rounded: fed llama.cpp's tokens, so that a tie moved at one step does
    // not change what later steps see.
    let feed = rounded.then_some(&want.greedy[..]);
    let got = tessera_logits(&stateless, &tokens, shape, feed).await;
    let figure = if rounded {
        let (median, alone, carried) = assert_rounded(&what, &got, &want);
        format!(
            "tokens alone median {median:.1e} of llama.cpp's, {alone} of {} moved by a \
             rounding tie ({carried} of {} prompt and step rows)",
            got.single.len(),
            got.prompt.len() + got.steps.len()
        )
    } else {
        let worst = assert_logits(&format!("{what} prompt"), &got.prompt, &want.prompt).max(
            assert_logits(&format!("{what} steps"), &got.steps, &want.steps),
        );
        format!("within {worst:.1e} of llama.cpp's")
    };
    let hosts = stateless.plan().hosts.join(" and ");
    stateless.unload().await.expect("unloaded");
    let generative = load(client, (gguf, &options), placement, true).await;
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

/// `curl ARGS`: the status and the body.
pub fn curl(args: &[&str]) -> (u16, String) {
    let out = output(
        Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}"])
            .args(args),
    );
    let (body, code) = out.trim_end().rsplit_once('\n').expect("a status line");
    (code.parse().expect("a status"), body.to_string())
}
