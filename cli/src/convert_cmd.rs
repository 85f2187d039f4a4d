//! `tessera convert`: a GGUF file written as an onnxruntime-genai model
//! folder (the graph Tessera builds from it in memory, its weights in
//! `model.onnx.data`, the tokenizer and configuration files), which
//! onnxruntime-genai and `tessera generate DIR` both run.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use tessera_common::memory::format_size;
use tessera_gguf::{folder, BuildOptions, GgufModel};

#[derive(Args)]
pub struct ConvertArgs {
    /// The GGUF file.
    gguf: PathBuf,
    /// The folder to write (created if missing).
    out_dir: PathBuf,
    /// MatMulNBits with float32 activations (accuracy level 0) instead of
    /// int8: slower, exact up to rounding (for checks).
    #[arg(long)]
    float_activations: bool,
}

pub fn convert(args: ConvertArgs) -> Result<()> {
    let started = Instant::now();
    // onnxruntime-genai runs the folder: MatMulNBits, no operators of
    // Tessera's own.
    let options = BuildOptions::portable(args.float_activations);
    let model = GgufModel::read(&args.gguf, &options)
        .with_context(|| format!("reading {}", args.gguf.display()))?;
    let c = &model.config;
    let summary = format!(
        "{}: {} layers, hidden {}, {}/{} heads of {}, vocabulary {}",
        c.arch,
        c.layers,
        c.hidden,
        c.heads,
        c.kv_heads,
        c.head_dim,
        model.vocab.len()
    );
    let written = folder::write(model, &args.out_dir)
        .with_context(|| format!("writing {}", args.out_dir.display()))?;
    crate::print_stdout(&format!(
        "{}: {summary}; {} in {:.1} s\n",
        args.out_dir.display(),
        format_size(written.model_bytes + written.data_bytes),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}
