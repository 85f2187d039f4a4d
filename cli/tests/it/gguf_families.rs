//! The decoder families besides llama (Qwen 2 and 3, Phi-3, Gemma 2 and 3,
//! and two mixtures of experts: Mixtral-style llama and Qwen2-MoE), each
//! from a GGUF `scripts/llm/write_gguf.py` writes with seeded random
//! weights at a small size that keeps the family's structure (its GQA
//! ratio, head size 64 to 256, tied or untied head, biases, q/k norms,
//! fused tensors, sliding windows shorter than the prompt, soft caps,
//! LongRoPE factors, experts), against llama.cpp on the same file.
//!
//! Float32 files are held to llama.cpp as the llama tests are (1e-3 × the
//! logits' largest magnitude at every prompt position and through 16
//! cached steps, the same 32 greedy tokens) on one worker and with the
//! second half of the layers on another; Q4_K files through Tessera's
//! kernels (the experts' products included) to llama.cpp's rounding on
//! the file itself. A mixture of experts too large for one worker is cut
//! between layers, every expert of a layer with it.

use crate::util;

use util::cluster::Cluster;
use util::llama_cpp::*;
use util::{runtime, Scratch};

const SPM_PROMPT: &str = "The old lighthouse keeper climbed the stairs every evening.";
const BPE_PROMPT: &str = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)";

/// A family's test model: `write_gguf.py` arguments, its cache's shape and
/// a prompt in its vocabulary.
struct Family {
    name: &'static str,
    args: &'static [&'static str],
    shape: Shape,
    prompt: &'static str,
}

const fn shape(layers: usize, kv_heads: usize, head_dim: usize) -> Shape {
    Shape {
        layers,
        kv_heads,
        head_dim,
    }
}

/// Each family as its own structure has it; windows of 8 positions, so
/// that the prompts (15–25 tokens) and the cached steps outgrow them.
const FAMILIES: [Family; 7] = [
    Family {
        name: "qwen2",
        // q/k/v biases, Qwen 2's pre-tokenizer, GQA 7:1 as Qwen2.5-0.5B
        // has it.
        args: &[
            "--arch",
            "qwen2",
            "--pre",
            "qwen2",
            "--heads",
            "7",
            "--kv-heads",
            "1",
            "--hidden",
            "448",
            "--rope-theta",
            "1000000",
            "--seed",
            "11",
        ],
        shape: shape(2, 1, 64),
        prompt: BPE_PROMPT,
    },
    Family {
        name: "qwen3",
        // q/k norms, heads of 128 wider than the hidden size, untied.
        args: &[
            "--arch",
            "qwen3",
            "--head-dim",
            "128",
            "--untied",
            "--pre",
            "qwen2",
            "--seed",
            "12",
        ],
        shape: shape(2, 2, 128),
        prompt: BPE_PROMPT,
    },
    Family {
        name: "phi3",
        // Fused q/k/v and gate/up, heads of 80 without GQA, LongRoPE's
        // short factors and attention factor, Phi-3's vocabulary.
        args: &[
            "--arch",
            "phi3",
            "--vocab",
            "phi3",
            "--hidden",
            "320",
            "--heads",
            "4",
            "--kv-heads",
            "4",
            "--longrope",
            "--seed",
            "13",
        ],
        shape: shape(2, 4, 80),
        prompt: SPM_PROMPT,
    },
    Family {
        name: "gemma2",
        // Heads of 256, local and global layers, both soft caps
        // (llama.cpp's defaults), post-norms, GELU, Gemma's vocabulary.
        args: &[
            "--arch",
            "gemma2",
            "--vocab",
            "gemma",
            "--heads",
            "2",
            "--kv-heads",
            "1",
            "--head-dim",
            "256",
            "--sliding-window",
            "8",
            "--layers",
            "3",
            "--seed",
            "14",
        ],
        shape: shape(3, 1, 256),
        prompt: SPM_PROMPT,
    },
    Family {
        name: "gemma3",
        // q/k norms, a local RoPE base beside a global one scaled ×8.
        args: &[
            "--arch",
            "gemma3",
            "--vocab",
            "gemma",
            "--heads",
            "4",
            "--kv-heads",
            "1",
            "--head-dim",
            "128",
            "--sliding-window",
            "8",
            "--sliding-window-pattern",
            "2",
            "--rope-theta",
            "1000000",
            "--rope",
            "linear:8",
            "--layers",
            "3",
            "--seed",
            "15",
        ],
        shape: shape(3, 1, 128),
        prompt: SPM_PROMPT,
    },
    Family {
        name: "mixtral",
        // A llama whose feed-forwards are 2 of 4 experts.
        args: &[
            "--arch",
            "llama",
            "--vocab",
            "spm",
            "--experts",
            "4",
            "--experts-used",
            "2",
            "--seed",
            "16",
        ],
        shape: shape(2, 2, 64),
        prompt: SPM_PROMPT,
    },
    Family {
        name: "qwen2moe",
        // 2 of 4 experts plus a shared expert under its sigmoid gate. (With
        // seed 17, one token's router has two experts so close that an
        // activation's 8-bit rounding tie, taken the other way, chooses the
        // other one: Tessera's kernels and llama.cpp then differ from that
        // token on, as llama.cpp's own kernels for another CPU could.)
        args: &[
            "--arch",
            "qwen2moe",
            "--pre",
            "qwen2",
            "--experts",
            "4",
            "--experts-used",
            "2",
            "--expert-ffn",
            "256",
            "--shared-ffn",
            "512",
            "--seed",
            "19",
        ],
        shape: shape(2, 2, 64),
        prompt: BPE_PROMPT,
    },
];

fn family(name: &str) -> &'static Family {
    FAMILIES.iter().find(|f| f.name == name).expect("a family")
}

#[test]
fn each_family_gives_llama_cpp_s_logits_and_greedy_tokens_on_one_worker_and_split() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("gguf-families");
    let cluster = Cluster::start("gguf-families", &["node-a", "node-b"], 1);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        for f in &FAMILIES {
            let gguf = write_gguf(&scratch, f.name, f.args);
            for placement in [
                Placement::On("HETERO:node-a/CPU"),
                Placement::Halves("node-a", "node-b"),
            ] {
                let case = Case::exact((&gguf, &gguf));
                check_against_llama_cpp(&client, case, f.prompt, (f.shape, placement), &scratch)
                    .await;
            }
        }
    });
}

#[test]
fn tessera_s_kernels_run_each_family_s_quantized_file_as_llama_cpp_does() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("gguf-families-q4k");
    let cluster = Cluster::start("gguf-families-q4k", &["node-a", "node-b"], 1);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        // Every matrix a whole number of Q4_K's 256-weight blocks a row.
        for name in ["gemma2", "qwen3", "mixtral", "qwen2moe"] {
            let f = family(name);
            let base = write_gguf(&scratch, f.name, f.args);
            let (file, _) = quantized(&base, "Q4_K");
            let placement = Placement::Halves("node-a", "node-b");
            let case = Case::kernels(&file);
            check_against_llama_cpp(&client, case, f.prompt, (f.shape, placement), &scratch).await;
        }
    });
}

/// Whether every layer's nodes ran on one host, by the plan's subgraphs.
fn layers_whole(network: &tessera_client::Network) -> bool {
    let mut host_of: std::collections::HashMap<usize, &str> = Default::default();
    for s in &network.plan().subgraphs {
        let host = s.device.as_str();
        for node in &s.nodes {
            let Some(layer) = node
                .strip_prefix("/model/layers.")
                .and_then(|r| r.split('/').next())
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            if *host_of.entry(layer).or_insert(host) != host {
                return false;
            }
        }
    }
    !host_of.is_empty()
}

#[test]
fn a_mixture_of_experts_too_big_for_one_worker_is_cut_between_layers() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("gguf-moe-split");
    // 4 layers of 4 experts (Q4_K, ~1 MiB a layer) and an untied head
    // beside the embedding (49,152 rows each, ~7 MiB each): two workers of
    // 12 MiB hold it together, neither alone; a third of no limit holds
    // all of it.
    let limit: &[&str] = &["--memory-limit", "12MiB"];
    let workers = [
        ("node-a", "CPU", limit),
        ("node-b", "CPU", limit),
        ("node-c", "CPU", &[][..]),
    ];
    let cluster = Cluster::start_with_args("gguf-moe-split", &workers, 1);
    let base = write_gguf(
        &scratch,
        "moe",
        &[
            "--arch",
            "llama",
            "--experts",
            "4",
            "--experts-used",
            "2",
            "--layers",
            "4",
            "--untied",
            "--seed",
            "18",
        ],
    );
    let (file, _) = quantized(&base, "Q4_K");
    let tokens = prompt_ids(&file, BPE_PROMPT);
    let shape = shape(4, 2, 64);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let options = tessera_gguf::BuildOptions::default();
        let split = Placement::On("HETERO:node-a/CPU,node-b/CPU");
        let network = load(&client, (&file, &options), split, false).await;
        let hosts = network.plan().hosts.clone();
        assert_eq!(hosts.len(), 2, "the model spans both workers: {hosts:?}");
        assert!(
            layers_whole(&network),
            "a layer was cut: {:?}",
            network.plan()
        );
        let got = tessera_logits(&network, &tokens, shape, None).await;
        network.unload().await.expect("unloaded");
        // The same kernels on one worker: the cut changes nothing. (How
        // they compare with llama.cpp: the kernels test above.)
        let whole = load(
            &client,
            (&file, &options),
            Placement::On("HETERO:node-c/CPU"),
            false,
        )
        .await;
        let want = tessera_logits(&whole, &tokens, shape, None).await;
        let rows = |r: &Reference| r.prompt.iter().chain(&r.steps).cloned().collect::<Vec<_>>();
        let worst = differences(&rows(&got), &rows(&want))
            .into_iter()
            .fold(0f32, |m, (d, _)| m.max(d));
        assert!(
            worst <= 1e-6,
            "split vs whole: {worst:.2e} of the largest logit"
        );
        assert_eq!(got.greedy, want.greedy, "the greedy tokens");
        eprintln!("cut between layers on {hosts:?}: logits within {worst:.1e} of one worker's");
    });
}

/// llama.cpp's copy of a model's chat template (`models/templates/` of the
/// source `scripts/llama-cpp.sh` unpacked).
fn llama_cpp_template(name: &str) -> std::path::PathBuf {
    let bin = llama_bin();
    let root = bin.parent().expect("the llama.cpp cache");
    let found = std::fs::read_dir(root)
        .expect("the llama.cpp cache")
        .filter_map(Result::ok)
        .map(|e| {
            e.path()
                .join("vendor/llama.cpp/models/templates")
                .join(format!("{name}.jinja"))
        })
        .find(|p| p.is_file());
    found.unwrap_or_else(|| panic!("llama.cpp's {name}.jinja"))
}

/// The chat as Hugging Face's apply_chat_template renders it (jinja2).
fn rendered(
    template: &std::path::Path,
    bos: &str,
    eos: &str,
    messages: &serde_json::Value,
) -> String {
    json_through(
        std::process::Command::new("python3")
            .arg(repo().join("scripts/llm/render_chat.py"))
            .arg(template)
            .args([bos, eos]),
        messages,
    )
}

/// Each family served by name through the OpenAI front door chats through
/// its own template (Qwen 2.5's, Qwen 3's, Phi-3.5's, Gemma 2's, Llama 2's
/// as the GGUF carries it): the prompt's tokens are those of the template
/// rendered as Hugging Face renders it, tokenized by llama.cpp, and the
/// greedy reply is llama.cpp's continuation of them.
#[test]
fn each_family_chats_through_openai_with_its_own_template() {
    let _one = one_at_a_time();
    let scratch = Scratch::new("gguf-families-chat");
    let cases = [
        ("qwen2", "Qwen-Qwen2.5-7B-Instruct"),
        ("qwen3", "Qwen-Qwen3-0.6B"),
        ("phi3", "microsoft-Phi-3.5-mini-instruct"),
        ("gemma2", "google-gemma-2-2b-it"),
        ("gemma3", "google-gemma-2-2b-it"),
        ("qwen2moe", "Qwen-Qwen2.5-7B-Instruct"),
        ("mixtral", ""),
    ];
    let mut table = String::new();
    let mut models = Vec::new();
    for (name, template) in cases {
        let f = family(name);
        let mut args: Vec<&str> = f.args.to_vec();
        let path;
        if !template.is_empty() {
            path = llama_cpp_template(template);
            args.extend(["--chat-template", path.to_str().expect("a path")]);
        }
        let gguf = write_gguf(&scratch, &format!("{name}-chat"), &args);
        table.push_str(&format!(
            "[models.{name}]\npath = \"{}\"\ndevices = \"CPU\"\ncontext = 256\n",
            gguf.display()
        ));
        models.push((name, gguf));
    }
    let port = util::kserve::free_port();
    let config = format!("http_listen = \"127.0.0.1:{port}\"\n{table}");
    let cluster = Cluster::start_configured("gguf-families-chat", &[("node-a", "CPU")], 1, &config);
    runtime().block_on(async {
        let client = cluster.client().await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let statuses = client.models().await.expect("the models");
            let ready = statuses
                .iter()
                .filter(|m| m.state == tessera_common::wire::control::ModelState::Ready)
                .count();
            if ready == models.len() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{statuses:#?}");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    });
    let messages = serde_json::json!([
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi! How can I help?"},
        {"role": "user", "content": "Name three colours."},
    ]);
    for (name, gguf) in &models {
        let read = tessera_gguf::generative::read(gguf, 1).expect("the GGUF reads");
        let spec = &read.spec;
        let template = scratch.join(format!("{name}.jinja"));
        std::fs::write(
            &template,
            spec.chat_template.as_deref().expect("a template"),
        )
        .unwrap();
        let (bos, eos) = (
            spec.bos_token.clone().unwrap_or_default(),
            spec.eos_token.clone().unwrap_or_default(),
        );
        let text = rendered(&template, &bos, &eos, &messages);
        let ids = llama_tokenize_plain(gguf, &text);
        let want = llama_eval(gguf, &ids, &scratch.join(format!("{name}.chat")));
        let tokenizer =
            tokenizers::Tokenizer::from_bytes(spec.tokenizer_json.as_bytes()).expect("a tokenizer");
        // llama.cpp's greedy reply up to the first end-of-generation token.
        let reply: Vec<u32> = want
            .greedy
            .iter()
            .take(8)
            .copied()
            .take_while(|id| !spec.eos_token_ids.contains(id))
            .collect();
        // A reply cut mid-character ends before the token that starts it
        // (a stream gives whole characters only).
        let mut reply = reply;
        let mut want_text = tokenizer.decode(&reply, true).expect("decodes");
        while want_text.ends_with('\u{FFFD}') && reply.pop().is_some() {
            want_text = tokenizer.decode(&reply, true).expect("decodes");
        }
        let body = serde_json::json!({
            "model": name, "messages": messages, "max_tokens": 8, "temperature": 0,
        });
        let (code, answer) = chat(port, &body);
        assert_eq!(code, 200, "{name}: {answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
        assert_eq!(
            answer["usage"]["prompt_tokens"].as_u64(),
            Some(ids.len() as u64),
            "{name}: the template's tokens ({text:?})"
        );
        let got = answer["choices"][0]["message"]["content"]
            .as_str()
            .expect("a reply");
        assert_eq!(got, want_text, "{name}: the greedy reply");
        eprintln!("{name}: {} prompt tokens, reply {got:?}", ids.len());
    }
}

/// A chat completion from the front door on `port`: status and body.
fn chat(port: u16, body: &serde_json::Value) -> (u16, String) {
    curl(&[
        "-X",
        "POST",
        &format!("http://127.0.0.1:{port}/v1/chat/completions"),
        "-H",
        "content-type: application/json",
        "-d",
        &body.to_string(),
    ])
}
