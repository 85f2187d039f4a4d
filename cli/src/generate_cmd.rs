//! `tessera generate`: text from a GGUF file or a generative model
//! folder, on a cluster
//! (`--coordinator ADDR`) or an embedded local one. Only the generated
//! text goes to stdout, as it comes; the plan and figures go to stderr.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use tessera_client::generate::{
    ChatMessage, Event, GenerateParams, GenerateStats, ModelFolder, Prompt,
};
use tessera_client::LoadOptions;
use tessera_common::memory::format_size;

use crate::remote::{with_client, RemoteArgs};

#[derive(Args)]
pub struct GenerateArgs {
    /// The model: a GGUF file, or a folder with model.onnx (and its
    /// external data), tokenizer.json, tokenizer_config.json,
    /// genai_config.json.
    model_dir: PathBuf,
    /// The text to continue (with --chat: the user's message).
    #[arg(long)]
    prompt: String,
    /// New tokens at most.
    #[arg(long, default_value_t = 128)]
    max_tokens: u32,
    /// 0: greedy (the most likely token each time).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sample among the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: u32,
    /// Sample among the most likely tokens whose probabilities add up to P.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// The sampler's seed (the same seed, the same text; default: a
    /// random one).
    #[arg(long)]
    seed: Option<u64>,
    /// A text that ends the generation (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Send the prompt as a user message through the model's chat template.
    #[arg(long)]
    chat: bool,
    /// With --chat: a system message first.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Device priority (default: every device of every worker).
    #[arg(long)]
    devices: Option<String>,
    /// Sequences each stage keeps state (KV cache) for at once.
    #[arg(long, default_value_t = 1)]
    max_sequences: u32,
    /// A GGUF's products in float32 (MatMulNBits accuracy level 0) instead
    /// of with activations rounded to 8 bits (Tessera's kernels, as
    /// llama.cpp, or MatMulNBits'): slower, exact up to rounding.
    #[arg(long)]
    float_activations: bool,
    /// A GGUF's products as onnxruntime's MatMulNBits with int8
    /// activations (the graph `tessera convert` writes, which any
    /// onnxruntime runs) instead of Tessera's kernels.
    #[arg(long, conflicts_with = "float_activations")]
    portable: bool,
    /// Positions (prompt and generated tokens) one sequence may hold; each
    /// stage budgets its state for this many (default: the model's
    /// context, at most 2048).
    #[arg(long)]
    context: Option<u32>,
    #[command(flatten)]
    remote: RemoteArgs,
}

pub fn generate(args: GenerateArgs) -> Result<()> {
    tessera_cli::cluster::run_system(generate_async(args))
}

async fn generate_async(args: GenerateArgs) -> Result<()> {
    let dir = args.model_dir.clone();
    let max_sequences = args.max_sequences;
    if (args.float_activations || args.portable) && !tessera_gguf::is_gguf(&dir) {
        anyhow::bail!(
            "--float-activations and --portable apply to GGUF files, not to {}",
            dir.display()
        );
    }
    let options = if args.float_activations || args.portable {
        tessera_gguf::BuildOptions::portable(args.float_activations)
    } else {
        tessera_gguf::BuildOptions::default()
    };
    let mut folder =
        tokio::task::spawn_blocking(move || ModelFolder::read_with(&dir, max_sequences, &options))
            .await
            .context("reading the model")??;
    let model_context = folder.generation.context_length;
    folder.generation.context_length = match args.context {
        Some(0) => anyhow::bail!("--context must be at least 1"),
        Some(c) if c > model_context => {
            anyhow::bail!("--context {c} is beyond the model's context of {model_context}")
        }
        Some(c) => c,
        None => model_context.min(tessera_common::wire::generate::DEFAULT_SERVED_CONTEXT),
    };
    with_client(&args.remote, async |client| {
        let options = LoadOptions {
            name: args.model_dir.display().to_string(),
            devices: args.devices.clone().unwrap_or_default(),
            generation: Some(folder.generation),
            model_sha256: folder.model_sha256,
            ..Default::default()
        };
        let started = Instant::now();
        let network = crate::progress::load_network(&client, folder.model, options).await?;
        eprintln!("loaded in {:.2} s", started.elapsed().as_secs_f64());
        for sg in &network.plan().subgraphs {
            eprintln!(
                "subgraph{} on {}: {} nodes, needs {}",
                sg.id,
                sg.device,
                sg.nodes.len(),
                format_size(sg.memory.total())
            );
        }
        let generation = network.generate(prompt(&args), params(&args)).await?;
        let stats = print_text(generation).await?;
        eprintln!("{}", figures(&stats));
        network.unload().await?;
        Ok(())
    })
    .await
}

fn prompt(args: &GenerateArgs) -> Prompt {
    if !args.chat {
        return Prompt::Text(args.prompt.clone());
    }
    let message = |role: &str, content: &str| ChatMessage {
        role: role.into(),
        content: content.into(),
    };
    let mut messages: Vec<ChatMessage> = args.system.iter().map(|s| message("system", s)).collect();
    messages.push(message("user", &args.prompt));
    Prompt::Chat(messages)
}

fn params(args: &GenerateArgs) -> GenerateParams {
    GenerateParams {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
        logprobs: 0,
        stop: args.stop.clone(),
        deadline_ms: args.remote.deadline_ms.unwrap_or(0),
    }
}

/// Prints the text as it comes; the figures at the end.
async fn print_text(mut generation: tessera_client::generate::Generation) -> Result<GenerateStats> {
    let mut stdout = std::io::stdout();
    while let Some(event) = generation.next().await? {
        match event {
            Event::Tokens { text, .. } => {
                let written = stdout
                    .write_all(text.as_bytes())
                    .and_then(|()| stdout.flush());
                if let Err(e) = written {
                    if e.kind() == std::io::ErrorKind::BrokenPipe {
                        break;
                    }
                    return Err(e).context("writing to stdout");
                }
            }
            Event::Done(stats) => {
                let _ = writeln!(stdout);
                return Ok(stats);
            }
        }
    }
    anyhow::bail!("the generation ended without its figures")
}

fn figures(s: &GenerateStats) -> String {
    let decode_s = s.total_us.saturating_sub(s.first_token_us) as f64 / 1e6;
    let rate = if s.generated_tokens > 1 && decode_s > 0.0 {
        f64::from(s.generated_tokens - 1) / decode_s
    } else {
        0.0
    };
    format!(
        "prompt {} tokens, generated {} ({}), first token {:.1} ms, {:.1} tokens/s after it{}",
        s.prompt_tokens,
        s.generated_tokens,
        s.finish.as_str(),
        s.first_token_us as f64 / 1e3,
        rate,
        if s.replays > 0 {
            format!(", state rebuilt {} times after worker losses", s.replays)
        } else {
            String::new()
        }
    )
}
