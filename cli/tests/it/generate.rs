//! Text generation across machines, on real worker processes: SmolLM2-135M
//! (`scripts/fetch-llm.sh`) split over two workers by memory gives
//! onnxruntime-genai's greedy text token for token (and onnxruntime's
//! logits step by step, within tolerance), also when the worker
//! holding a stage is killed mid-generation (the sequence's state is
//! rebuilt by replaying its tokens); bad requests get clear errors; a full
//! stage refuses a new sequence until a client that left frees its state;
//! the real `openai` Python client gets the same text over HTTP, whole and
//! streamed, and a stream through a worker's front door finishes with it
//! when the coordinator is killed mid-stream; the 4-bit variant
//! (MatMulNBits) split over two workers gives onnxruntime-genai's text on
//! that folder, as does the one whose token embedding stays 8-bit; the
//! folders' logits match a numpy forward over the GGUF file's own weights.

use crate::util;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tessera_client::generate::{
    ChatMessage, Event, GenerateParams, GenerateStats, ModelFolder, Prompt,
};
use tessera_client::{Client, LoadOptions, Network};
use tessera_common::tensor::Tensor;
use util::cluster::Cluster;
use util::genai::{genai, Oracle};
use util::runtime;

/// Each test's cluster runs alone: on two cores, a generation whose
/// worker is killed must be re-planned and replayed within its deadline,
/// which a sibling test's model loading can starve.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

fn folder(name: &str) -> PathBuf {
    util::model(name)
}

/// Each of `prompts` generated alone on `network` (greedy, `max_tokens`)
/// gives onnxruntime-genai's ids and text.
async fn each_equals_genai(network: &Network, prompts: &[&str], want: &[Oracle], max_tokens: u32) {
    for (prompt, want) in prompts.iter().zip(want) {
        let (text, ids, stats) = run(
            network,
            Prompt::Text(prompt.to_string()),
            greedy(max_tokens),
        )
        .await;
        eprintln!("{prompt:?} → {text:?} ({stats:?})");
        assert_eq!(ids, want.ids, "{prompt:?}: {text:?} vs {:?}", want.text);
        assert_eq!(text, want.text);
    }
}

/// The most likely token of `logits`.
fn argmax(logits: &[f32]) -> u32 {
    let best = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b]));
    best.expect("logits") as u32
}

/// Each step's inputs, the tokens picked and each step's last-position
/// logits.
type Steps = (Vec<Vec<(String, Tensor)>>, Vec<u32>, Vec<Vec<f32>>);

/// A fresh step over `prompt`, then `steps` greedy decode steps, on
/// `network` as stateless requests (the client feeds the cache back).
async fn stateless_steps(network: &Network, prompt: &[u32], steps: usize) -> Steps {
    let ints =
        |values: Vec<i64>| Tensor::from_values(vec![1, values.len()], &values).expect("ints");
    let mut past: Vec<(String, Tensor)> = (0..30)
        .flat_map(|l| ["key", "value"].map(|kv| format!("past_key_values.{l}.{kv}")))
        .map(|name| {
            (
                name,
                Tensor::from_values(vec![1, 3, 0, 64], &[] as &[f32]).expect("empty"),
            )
        })
        .collect();
    let (mut feed, mut total) = (prompt.to_vec(), 0usize);
    let (mut runs, mut tokens, mut logits) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..=steps {
        let n = feed.len();
        let mut inputs = vec![
            (
                "input_ids".to_string(),
                ints(feed.iter().map(|&t| i64::from(t)).collect()),
            ),
            ("attention_mask".to_string(), ints(vec![1; total + n])),
            (
                "position_ids".to_string(),
                ints((total as i64..(total + n) as i64).collect()),
            ),
        ];
        inputs.append(&mut past);
        runs.push(inputs.clone());
        let outputs = network.infer(inputs).await.expect("a step");
        for (name, t) in outputs.tensors {
            match name.strip_prefix("present") {
                Some(rest) => past.push((format!("past_key_values{rest}"), t)),
                None if name == "logits" => {
                    let all = t.float_values().expect("float logits");
                    logits.push(all[all.len() - 49152..].to_vec());
                }
                None => {}
            }
        }
        let best = argmax(logits.last().expect("logits"));
        tokens.push(best);
        total += n;
        feed = vec![best];
    }
    (runs, tokens, logits)
}

fn greedy(max_tokens: u32) -> GenerateParams {
    GenerateParams {
        max_tokens,
        ..GenerateParams::default()
    }
}

fn user(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage {
        role: "user".into(),
        content: text.into(),
    }])
}

async fn load(
    client: &Client,
    folder: &std::path::Path,
    max_sequences: u32,
    context: u32,
) -> Network {
    let mut model = ModelFolder::read(folder, max_sequences).expect("model folder");
    model.generation.context_length = context;
    // One fresh sequence may wait for room (beyond: refused as busy).
    model.generation.max_queued = 1;
    let options = LoadOptions {
        devices: "CPU".into(),
        generation: Some(model.generation),
        ..Default::default()
    };
    client
        .load_network(model.model, options)
        .await
        .expect("loaded")
}

async fn run(
    network: &Network,
    prompt: Prompt,
    params: GenerateParams,
) -> (String, Vec<u32>, GenerateStats) {
    let generation = network.generate(prompt, params).await.expect("started");
    generation.collect().await.expect("generated")
}

#[test]
fn greedy_text_split_over_two_workers_equals_onnxruntime_genai_even_after_a_worker_is_killed() {
    let _one = one_at_a_time();
    let model = folder("smollm2-135m-instruct");
    // 513 MiB of weights (the tied embedding counted on the first and the
    // last stage) and 3 sequences × 256 positions of KV cache: two of
    // these workers hold it, one does not.
    let limit: &[&str] = &["--memory-limit", "380MiB"];
    let names = ["node-a", "node-b", "node-c"];
    let workers: Vec<(&str, &str, &[&str])> = names.iter().map(|n| (*n, "CPU", limit)).collect();
    let mut cluster = Cluster::start_with_args("generate", &workers, 1);
    let prompts = ["The capital of France is", "def fibonacci(n):"];
    let plain = genai(&model, &prompts, 24, false);
    let chat = genai(&model, &["What is the capital of France?"], 24, true);
    let long = genai(&model, &["Once upon a time"], 40, false);
    let rt = runtime();
    let killed = rt.block_on(async {
        let client = cluster.client().await;
        let network = load(&client, &model, 3, 256).await;
        let hosts = &network.plan().hosts;
        assert!(hosts.len() >= 2, "the model spans workers: {hosts:?}");
        each_equals_genai(&network, &prompts, &plain, 24).await;
        // The prompts at once, and a third of another length: their decode
        // steps run as batches (a row each, the shorter rows' caches
        // padded and masked), and each text is still the one alone.
        let text = |p: &str| Prompt::Text(p.to_string());
        let (a, b, c) = tokio::join!(
            run(&network, text(prompts[0]), greedy(24)),
            run(&network, text(prompts[1]), greedy(24)),
            run(&network, text("Once upon a time"), greedy(24)),
        );
        let wanted = [&plain[0].ids[..], &plain[1].ids[..], &long[0].ids[..24]];
        for ((got, ids, stats), want) in [a, b, c].iter().zip(wanted) {
            eprintln!("at once: {got:?} ({stats:?})");
            assert_eq!(ids.as_slice(), want, "{got:?}");
        }
        // The split's logits, a fresh step and three decode steps, within
        // 1e-3 × max(1, max |logit|) of onnxruntime's on the same inputs,
        // and the same tokens picked.
        let (runs, tokens, logits) = stateless_steps(&network, &plain[0].prompt_ids, 3).await;
        let oracle = util::oracle::onnxruntime_many(
            &model.join("model.onnx"),
            &runs,
            &cluster.dir.join("oracle"),
        );
        for (step, ((got, token), outputs)) in logits.iter().zip(&tokens).zip(&oracle).enumerate() {
            let all = outputs[0].float_values().expect("onnxruntime's logits");
            let want = &all[all.len() - got.len()..];
            assert_eq!(*token, argmax(want), "step {step}");
            let scale = want.iter().fold(1f32, |m, x| m.max(x.abs()));
            let diff = got
                .iter()
                .zip(want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            eprintln!(
                "step {step}: logits within {diff:.2e} of onnxruntime's (max |logit| {scale:.1})"
            );
            assert!(diff <= 1e-3 * scale, "step {step}: {diff} > 1e-3 × {scale}");
        }
        let (text, ids, _) =
            run(&network, user("What is the capital of France?"), greedy(24)).await;
        assert_eq!(ids, chat[0].ids, "chat: {text:?} vs {:?}", chat[0].text);
        assert!(text.contains("Paris"), "{text}");
        // Kill the worker of the last stage after a few tokens.
        let last = network
            .plan()
            .subgraphs
            .last()
            .expect("a stage")
            .device
            .clone();
        let host = last.split('/').next().unwrap_or_default().to_string();
        let mut generation = network
            .generate(Prompt::Text("Once upon a time".into()), greedy(40))
            .await
            .expect("started");
        let (mut ids, mut text, mut stats) = (Vec::new(), String::new(), None);
        let mut killed = false;
        while let Some(event) = generation.next().await.expect("generation goes on") {
            match event {
                Event::Tokens {
                    ids: i, text: t, ..
                } => {
                    ids.extend(i);
                    text.push_str(&t);
                    if ids.len() >= 6 && !killed {
                        let at = names.iter().position(|n| *n == host).expect("a worker");
                        cluster.workers[at].kill();
                        killed = true;
                    }
                }
                Event::Done(s) => stats = Some(s),
            }
        }
        let stats = stats.expect("figures");
        eprintln!("after killing {host}: {text:?} ({stats:?})");
        assert!(stats.replays >= 1, "{stats:?}");
        assert_eq!(ids, long[0].ids, "{text:?} vs {:?}", long[0].text);
        assert_eq!(text, long[0].text);
        host
    });
    eprintln!("killed {killed}");
}

#[test]
fn bad_requests_are_refused_and_a_full_stage_waits_for_a_sequence_to_end() {
    let _one = one_at_a_time();
    let model = folder("smollm2-tiny");
    let cluster = Cluster::start("generate-bad", &["node-a"], 1);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let network = load(&client, &model, 1, 64).await;
        let refused = |params: GenerateParams, prompt: Prompt| {
            let network = network.clone();
            async move {
                let result = match network.generate(prompt, params).await {
                    Ok(g) => g.collect().await.map(|_| ()),
                    Err(e) => Err(e),
                };
                result.expect_err("refused").to_string()
            }
        };
        let text = |t: &str| Prompt::Text(t.into());
        let cases: Vec<(GenerateParams, Prompt, &str)> = vec![
            (greedy(8), text(""), "the prompt is empty"),
            (greedy(0), text("hi"), "max tokens must be at least 1"),
            (greedy(64), text("hi"), "beyond the model's context of 64"),
            (
                GenerateParams {
                    temperature: -1.0,
                    ..greedy(8)
                },
                text("hi"),
                "temperature must be",
            ),
            (
                GenerateParams {
                    top_p: 0.0,
                    ..greedy(8)
                },
                text("hi"),
                "top_p must be",
            ),
            (
                greedy(8),
                text(&"word ".repeat(80)),
                "exceed the model's context of 64",
            ),
            (
                greedy(8),
                Prompt::Chat(Vec::new()),
                "the chat has no messages",
            ),
        ];
        for (params, prompt, want) in cases {
            let err = refused(params, prompt).await;
            assert!(err.contains(want), "{want}: {err}");
        }
        // The same seed samples the same text; a stop string ends it.
        let hot = GenerateParams {
            temperature: 1.0,
            top_k: 50,
            seed: Some(3),
            ..greedy(12)
        };
        let (a, _, _) = run(&network, text("Hello"), hot.clone()).await;
        let (b, _, _) = run(&network, text("Hello"), hot).await;
        assert_eq!(a, b);
        let (plain, _, _) = run(&network, text("Hello"), greedy(6)).await;
        let stop = plain.get(3..6).unwrap_or(&plain).to_string();
        let stopped = GenerateParams {
            stop: vec![stop.clone()],
            ..greedy(6)
        };
        let (cut, _, stats) = run(&network, text("Hello"), stopped).await;
        assert!(
            !cut.contains(&stop) && plain.starts_with(&cut),
            "{cut:?} {plain:?}"
        );
        assert_eq!(stats.finish, tessera_client::generate::FinishReason::Stop);
        // One sequence at a time: a second waits in the stage's queue for
        // the first to leave, then runs.
        let mut first = network
            .generate(text("Hello"), greedy(60))
            .await
            .expect("first");
        assert!(matches!(first.next().await, Ok(Some(Event::Tokens { .. }))));
        let second = {
            let network = network.clone();
            tokio::spawn(async move { run(&network, Prompt::Text("Hi".into()), greedy(4)).await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !second.is_finished(),
            "the second waits while the first holds the stage"
        );
        drop(first);
        let (_, ids, _) = tokio::time::timeout(Duration::from_secs(30), second)
            .await
            .expect("the second ran once the first left")
            .expect("the second generation");
        assert!(!ids.is_empty());
        // A full queue refuses as busy: one sequence, one waiting, a third
        // is refused.
        let mut one = load(&client, &model, 1, 64).await;
        one = one.with_deadline(Duration::from_secs(30));
        let mut holding = one
            .generate(text("Hello"), greedy(60))
            .await
            .expect("first");
        assert!(matches!(
            holding.next().await,
            Ok(Some(Event::Tokens { .. }))
        ));
        let waiting = one.generate(text("Hi"), greedy(4)).await.expect("second");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let busy = match one.generate(text("Hey"), greedy(4)).await {
            Ok(g) => g.collect().await.expect_err("a third is refused"),
            Err(e) => e,
        };
        assert_eq!(busy.kind(), tessera_client::ErrorKind::Busy, "{busy}");
        drop(holding);
        waiting.collect().await.expect("the waiting one ran");
        // Two sequences batched, and one client leaves mid-generation: the
        // other still gets the text it gets alone, and the one that left
        // frees its state once its last step is back (two new sequences
        // then fit the stage's two).
        let pair = load(&client, &model, 2, 64).await;
        let (_, alone, _) = run(&pair, text("Hello"), greedy(30)).await;
        let mut leaving = pair
            .generate(text("The capital"), greedy(30))
            .await
            .expect("leaving");
        let staying = {
            let pair = pair.clone();
            tokio::spawn(async move { run(&pair, Prompt::Text("Hello".into()), greedy(30)).await })
        };
        for _ in 0..3 {
            assert!(matches!(
                leaving.next().await,
                Ok(Some(Event::Tokens { .. }))
            ));
        }
        drop(leaving);
        let (_, ids, _) = staying.await.expect("the other generation");
        assert_eq!(ids, alone);
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let both = async |t: &str| {
                let generation = pair.generate(text(t), greedy(4)).await?;
                generation.collect().await
            };
            match tokio::join!(both("a"), both("b")) {
                (Ok(_), Ok(_)) => break,
                (a, b) if Instant::now() < until => {
                    eprintln!("waiting for the state of the one that left to go: {a:?} {b:?}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (a, b) => panic!("the stage never freed the sequence: {a:?} {b:?}"),
            }
        }
        // A network loaded without a tokenizer does not generate.
        let bytes = std::fs::read(model.join("model.onnx")).expect("model");
        let plain = client
            .load_network(bytes, LoadOptions::devices("CPU"))
            .await
            .expect("loaded");
        let err = match plain.generate(text("Hi"), greedy(4)).await {
            Ok(g) => g.collect().await.err().map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        let err = err.unwrap_or_default();
        assert!(err.contains("does not generate"), "{err}");
    });
    // A folder without a tokenizer is refused before anything is sent.
    let empty = cluster.dir.join("no-tokenizer");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::copy(model.join("model.onnx"), empty.join("model.onnx")).unwrap();
    let err = ModelFolder::read(&empty, 1)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("no tokenizer.json"), "{err}");
}

#[test]
fn the_cli_prints_only_the_generated_text() {
    let _one = one_at_a_time();
    let model = folder("smollm2-tiny");
    let want = genai(&model, &["The capital of France is"], 10, false);
    let dir = model.to_str().unwrap();
    let (ok, out, err) = util::tessera(&[
        "generate",
        dir,
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "10",
        "--workers",
        "1",
        "--context",
        "128",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, format!("{}\n", want[0].text));
    assert!(err.contains("generated 10 (length)"), "{err}");
    let (ok, _, err) = util::tessera(&["generate", dir, "--prompt", "x", "--context", "999999"]);
    assert!(!ok && err.contains("beyond the model's context"), "{err}");
}

#[test]
fn the_openai_client_streams_completions_and_chats() {
    let _one = one_at_a_time();
    let model = folder("smollm2-135m-instruct");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // A named generative model: its folder in cluster.toml, two copies of
    // 2 sequences each, 2 more waiting at each.
    let config = format!(
        "http_listen = \"127.0.0.1:{port}\"\n[models.smollm2]\npath = {:?}\ndevices = \"CPU\"\n\
         context = 256\nmax_sequences = 2\nmax_queued = 2\nreplicas = 2\n",
        model.display().to_string()
    );
    // The worker's own front door too.
    let worker_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{worker_port}");
    let door: &[&str] = &["--http-listen", &listen];
    let cluster = Cluster::start_configured_with_args(
        "generate-openai",
        &[("node-a", "CPU", door)],
        1,
        &config,
    );
    let plain = genai(&model, &["The capital of France is"], 12, false);
    let chat = genai(&model, &["What is the capital of France?"], 12, true);
    let expected = serde_json::json!({
        "plain": { "prompt": "The capital of France is", "text": plain[0].text, "max_tokens": 12 },
        "chat": { "prompt": "What is the capital of France?", "text": chat[0].text, "max_tokens": 12 },
    });
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/python/openai_test.py"
    );
    // The coordinator's front door, then the worker's.
    for url in [format!("127.0.0.1:{port}"), listen.clone()] {
        let out = std::process::Command::new("python3")
            .arg(script)
            .arg(format!("http://{url}/v1"))
            .arg("smollm2")
            .arg(expected.to_string())
            .output()
            .expect("python3 with openai (scripts/test.sh installs it)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("{url}:\n{stdout}");
        assert!(
            out.status.success(),
            "openai_test.py against {url} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // guidellm's backend: its validation, default model and one request.
    let out = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/python/guidellm_test.py"
        ))
        .arg(format!("http://127.0.0.1:{port}"))
        .arg("smollm2")
        .output()
        .expect("python3 with guidellm (scripts/test.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("guidellm:\n{stdout}");
    assert!(
        out.status.success(),
        "guidellm_test.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // curl's view of /health: 200 while the model serves, 503 with why
    // once it is unloaded, at both front doors.
    for url in [format!("127.0.0.1:{port}"), listen.clone()] {
        assert_eq!(curl_health(&url), (200, "ok".to_string()), "{url}");
    }
    let mut unload = vec!["unload".to_string(), "smollm2".into()];
    unload.extend(cluster.client_args());
    let unload: Vec<&str> = unload.iter().map(String::as_str).collect();
    let (ok, _, err) = util::tessera(&unload);
    assert!(ok, "{err}");
    for url in [format!("127.0.0.1:{port}"), listen] {
        let (code, body) = curl_health(&url);
        assert_eq!(code, 503, "{url}: {body}");
        assert!(body.contains("no model is loaded"), "{url}: {body}");
    }
}

/// `curl` on a front door's `/health`: the status and the answer's
/// `status`, else its `error`.
fn curl_health(url: &str) -> (u16, String) {
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "-w",
            "\n%{http_code}",
            &format!("http://{url}/health"),
        ])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').expect("a status line");
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON answer");
    let what = match body["status"].as_str() {
        Some("ok") => "ok".to_string(),
        _ => body["error"].as_str().unwrap_or_default().to_string(),
    };
    (code.trim().parse().expect("a status"), what)
}

/// A generation streaming through a worker's front door (the real `openai`
/// client) when the leading coordinator of two (HA, on a real etcd) is
/// killed with SIGKILL: it finishes with onnxruntime-genai's greedy text
/// (the front door and the workers need no coordinator mid-generation);
/// the standby takes over, adopts the model as the worker runs it, and
/// the next generation has the same text.
#[test]
fn a_generation_through_a_workers_front_door_finishes_when_the_leader_is_killed() {
    let _one = one_at_a_time();
    let model = folder("smollm2-135m-instruct");
    let config = format!(
        "[models.smollm2]\npath = {:?}\ndevices = \"CPU\"\ncontext = 256\nmax_sequences = 2\n",
        model.display().to_string()
    );
    let listen = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", l.local_addr().unwrap().port())
    };
    let door: &[&str] = &["--http-listen", &listen];
    let mut cluster =
        util::ha::HaCluster::start("generate-leader-killed", &[("node-a", door)], &config);
    let prompt = "Once upon a time";
    let want = genai(&model, &[prompt], 48, false);
    let (tx, rx) = std::sync::mpsc::channel();
    let streaming = std::thread::spawn({
        let listen = listen.clone();
        move || openai_stream(&listen, prompt, 48, Some(tx))
    });
    // Four chunks in, the leader dies.
    for _ in 0..4 {
        rx.recv_timeout(Duration::from_secs(180))
            .expect("the stream started");
    }
    cluster.coordinators[0].kill();
    let got = streaming.join().expect("the stream finished");
    assert_eq!(got, want[0].text, "the text despite the leader's death");
    let standby = &cluster.coordinators[1];
    assert!(
        util::ha::wait_log(
            standby,
            "adopted what the worker still serves",
            Duration::from_secs(30)
        ),
        "{}",
        standby.log_text()
    );
    let again = openai_stream(&listen, prompt, 48, None);
    assert_eq!(again, want[0].text, "after the takeover");
}

/// One greedy completion streamed through the real `openai` client from
/// the front door at `listen`; `chunks` hears of each chunk as it comes.
fn openai_stream(
    listen: &str,
    prompt: &str,
    max_tokens: u32,
    chunks: Option<std::sync::mpsc::Sender<()>>,
) -> String {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/python/openai_stream.py"
    );
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .arg(format!("http://{listen}/v1"))
        .args(["smollm2", prompt, &max_tokens.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with openai (scripts/test.sh installs it)");
    let stdout = child.stdout.take().unwrap();
    let mut text = None;
    for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
        if line.starts_with("chunk: ") {
            if let Some(tx) = &chunks {
                let _ = tx.send(());
            }
        } else if let Some(json) = line.strip_prefix("text: ") {
            text = serde_json::from_str::<String>(json).ok();
        }
    }
    assert!(child.wait().unwrap().success(), "the stream failed");
    text.expect("a text")
}

#[test]
fn greedy_text_over_a_gpu_and_a_cpu_worker_equals_onnxruntime_genai() {
    let _one = one_at_a_time();
    if let Err(e) = tessera_worker::plugins::gpu::GpuPlugin::new() {
        if std::env::var("TESSERA_GPU_TESTS").as_deref() == Ok("required") {
            panic!("{e}");
        }
        println!("SKIPPED: {e}");
        return;
    }
    // The 2-layer model interleaved over a GPU and a CPU worker (lavapipe
    // runs the 30-layer one at a token every few seconds): a state input
    // read on one worker by two subgraphs (the mask reads the cache's
    // length), a state output streamed to the other worker's attention,
    // and steps that bring a subgraph only its state.
    let model = folder("smollm2-tiny");
    let want = genai(&model, &["The capital of France is", "Hello"], 12, false);
    let cluster = Cluster::start_with("generate-gpu", &[("node-a", "GPU"), ("node-b", "CPU")], 1);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let mut folder = ModelFolder::read(&model, 1).expect("model folder");
        folder.generation.context_length = 64;
        let options = LoadOptions {
            devices: "HETERO:node-a/GPU,node-b/CPU".into(),
            generation: Some(folder.generation),
            ..Default::default()
        };
        let network = client
            .load_network(folder.model, options)
            .await
            .expect("loaded");
        let devices: Vec<&str> = network
            .plan()
            .subgraphs
            .iter()
            .map(|s| s.device.as_str())
            .collect();
        assert!(
            devices.contains(&"node-a/GPU") && devices.contains(&"node-b/CPU"),
            "{devices:?}"
        );
        for (prompt, want) in ["The capital of France is", "Hello"].iter().zip(&want) {
            let (text, ids, _) = run(&network, Prompt::Text(prompt.to_string()), greedy(12)).await;
            assert_eq!(ids, want.ids, "{prompt:?}: {text:?} vs {:?}", want.text);
        }
    });
}

/// The GGUF scripts/fetch-llm.sh converts (SmolLM2-135M-Instruct, Q4_1).
fn smollm2_gguf() -> PathBuf {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    PathBuf::from(format!(
        "{root}/.cache/wheels/SmolLM2-135M-Instruct.Q4_1.gguf"
    ))
}

/// Runs `scripts/llm/SCRIPT` with `args`; its stdout (a failure is the
/// test's, with both outputs).
fn llm_script(script: &str, args: &[&std::ffi::OsStr]) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = std::process::Command::new("python3")
        .arg(format!("{root}/scripts/llm/{script}"))
        .args(args)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} {args:?}:\n{stdout}\n{stderr}"
    );
    stdout
}

/// The converted folders' logits against a float64 numpy forward over the
/// GGUF file's own weights (the gguf library's dequantization, llama.cpp's
/// row order and interleaved RoPE), so that a bug in the converter's
/// dequantization or Q/K row permutation shows, and through the cache and
/// in a left-padded batch against the rows alone: the float32 folder
/// within 1e-3 of the logits' scale, the 4-bit one (int8 activations)
/// within 0.1, all picking the same most likely token at every position.
/// The 4-bit graph (fused operators, GroupQueryAttention over left-padded
/// rows) is also converted with float32 activations, which take int8's
/// rounding away: within 1e-3 then; and so are copies of the GGUF whose
/// linear weights were quantized again to other types, each against its
/// own numpy forward: Q4_K and Q5_K (SmolLM2's 576-input weights are not
/// whole 256-weight super-blocks, so they get llama-quantize's fallbacks
/// Q5_0 and Q5_1), and a mix in the manner of Q4_K_M (Q4_0, attn_v in Q8_0
/// so that q, k and v are products of different forms, ffn_down in Q6_K,
/// the token embedding in Q5_0) with an output head of its own in Q4_0,
/// as most models past ~1B have (the embedding's rows each scaled, so that
/// reading one for the other shows). Each copy's folder keeps the GGUF's types
/// (5- and 6-bit values in 8 bits: at most 1.5x its bytes, where float32
/// would be 5x).
#[test]
fn the_converted_folders_match_the_gguf_s_own_numpy_forward() {
    let scratch =
        std::env::temp_dir().join(format!("tessera-converted-types-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("scratch folder");
    let exact = |source: &std::path::Path, name: &str| {
        let folder = scratch.join(name);
        llm_script(
            "convert_gguf.py",
            &[
                source.as_os_str(),
                folder.as_os_str(),
                "--q4".as_ref(),
                "--float-activations".as_ref(),
            ],
        );
        folder
    };
    let original = smollm2_gguf();
    let mut folders = vec![
        (folder("smollm2-135m-instruct"), original.clone(), "1e-3"),
        // int8 activations: on a CPU without VNNI onnxruntime's u8s8
        // kernels add pairs of products in 16 bits, saturating
        // (vpmaddubsw), and a cached pass differed from a full one by 0.13
        // of the largest logit on an AVX2 EPYC (0.1 held with AVX-512);
        // the most likely token agreed at every position.
        (folder("smollm2-135m-instruct-q4"), original.clone(), "0.15"),
        (exact(&original, "q4_1"), original.clone(), "1e-3"),
    ];
    let mix = "Q4_0 --type-of attn_v=Q8_0 --type-of ffn_down=Q6_K --type-of token_embd=Q5_0 \
               --untie Q4_0";
    for (name, types) in [("Q4_K", "Q4_K"), ("Q5_K", "Q5_K"), ("mix", mix)] {
        let copy = scratch.join(format!("{name}.gguf"));
        let mut args = vec![original.as_os_str(), copy.as_os_str(), "--type".as_ref()];
        args.extend(types.split_whitespace().map(std::ffi::OsStr::new));
        llm_script("requantize_gguf.py", &args);
        let folder = exact(&copy, name);
        let ratio = folder_bytes(&folder) as f64 / file_bytes(&copy) as f64;
        println!("{name}: the folder is {ratio:.2}x the GGUF's bytes");
        assert!(
            ratio <= 1.5,
            "{name}: the folder is {ratio:.2}x the GGUF's bytes"
        );
        folders.push((folder, copy, "1e-3"));
    }
    for (path, source, tolerance) in folders {
        let args = [
            path.as_os_str(),
            "--gguf".as_ref(),
            source.as_os_str(),
            "--tolerance".as_ref(),
            tolerance.as_ref(),
            "--logits-only".as_ref(),
        ];
        let stdout = llm_script("check_model.py", &args);
        println!("{} against {}:\n{stdout}", path.display(), source.display());
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

fn file_bytes(path: &std::path::Path) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .len()
}

/// The bytes of a converted folder's model (graph and weights).
fn folder_bytes(folder: &std::path::Path) -> u64 {
    ["model.onnx", "model.onnx.data"]
        .iter()
        .map(|name| folder.join(name))
        .filter(|path| path.exists())
        .map(|path| file_bytes(&path))
        .sum()
}

#[test]
fn four_bit_weights_split_over_two_workers_give_onnxruntime_genai_s_text() {
    let _one = one_at_a_time();
    // SmolLM2 with its Q4_1 linear weights kept 4-bit (MatMulNBits, the
    // graph of onnxruntime's fused operators) and its Q8_0 token embedding
    // kept 8-bit, as --q4 keeps it (a lookup of bytes and scales, the tied
    // head MatMulNBits with 8 bits): 111 MiB of weights, the embedding 30.6
    // MiB in the first stage and in the last; two workers of 100 MiB hold
    // it, one does not, so the stages ship and compile com.microsoft nodes.
    let gguf = smollm2_gguf();
    quantized_split_gives_genai_s_text("q4", &gguf, &["--q4"], "100MiB");
    // A copy in the manner of Q4_K_M with a head of its own (Q4_0; q, k and
    // v of two forms; ffn_down Q6_K, whose factors Tessera's simplification
    // multiplies at load; the embedding Q5_0): 138 MiB of weights, two
    // workers of 100 MiB.
    let copy = std::env::temp_dir().join(format!("tessera-mix-{}.gguf", std::process::id()));
    let types = "--type Q4_0 --type-of attn_v=Q8_0 --type-of ffn_down=Q6_K \
                 --type-of token_embd=Q5_0 --untie Q4_0";
    let mut args = vec![gguf.as_os_str(), copy.as_os_str()];
    args.extend(types.split_whitespace().map(std::ffi::OsStr::new));
    llm_script("requantize_gguf.py", &args);
    quantized_split_gives_genai_s_text("mix", &copy, &["--q4"], "100MiB");
    let _ = std::fs::remove_file(&copy);
}

/// `gguf` converted with `flags` and float32 activations (a folder and a
/// cluster named by `label`), split over two
/// workers of `limit` each, gives onnxruntime-genai's greedy text on that
/// folder. Float32 activations: with int8 ones (the folders' default) a
/// different cut lets onnxruntime fuse other kernels across it, which moves
/// an activation's int8 rounding, and a near tie between two tokens (" 2017"
/// and " 2018" after "The answer is:") goes either way; the split is
/// checked on the exact graph.
fn quantized_split_gives_genai_s_text(
    label: &str,
    gguf: &std::path::Path,
    flags: &[&str],
    limit: &str,
) {
    let name = format!("{label}-split-{}", std::process::id());
    let model = std::env::temp_dir().join(format!("tessera-{name}"));
    let mut args: Vec<&std::ffi::OsStr> = vec![gguf.as_os_str(), model.as_os_str()];
    args.extend(flags.iter().map(std::ffi::OsStr::new));
    args.push("--float-activations".as_ref());
    llm_script("convert_gguf.py", &args);
    let prompts = ["The capital of France is", "Once upon a time"];
    let want = genai(&model, &prompts, 20, false);
    let limit: &[&str] = &["--memory-limit", limit];
    let workers: Vec<(&str, &str, &[&str])> =
        vec![("node-a", "CPU", limit), ("node-b", "CPU", limit)];
    let cluster = Cluster::start_with_args(&format!("generate-{name}"), &workers, 1);
    let rt = runtime();
    rt.block_on(async {
        let client = cluster.client().await;
        let network = load(&client, &model, 2, 128).await;
        let hosts = &network.plan().hosts;
        assert_eq!(hosts.len(), 2, "{flags:?} spans both workers: {hosts:?}");
        each_equals_genai(&network, &prompts, &want, 20).await;
        // At once: the prompts (4 and 5 tokens) decode as batches, the
        // shorter row left-padded and masked (GroupQueryAttention's bias).
        let text = |p: &str| Prompt::Text(p.to_string());
        let (a, b) = tokio::join!(
            run(&network, text(prompts[0]), greedy(20)),
            run(&network, text(prompts[1]), greedy(20)),
        );
        for ((got, ids, _), want) in [a, b].iter().zip(&want) {
            assert_eq!(ids, &want.ids, "at once: {got:?} vs {:?}", want.text);
        }
    });
    let _ = std::fs::remove_dir_all(&model);
}
