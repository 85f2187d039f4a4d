//! `tessera`: the command-line tool.
//!
//! Commands: `partition`, a dry run of Tessera's planner (affinity and
//! subgraph selection, explained and dumped as GraphViz and JSON, device
//! support from `--supports` files); `run --local`, one inference through
//! HETERO on this machine's plugins, inputs and outputs as `.npy`;
//! `certs init`, the cluster CA and node certificates.
//!
//! ```text
//! tessera partition model.onnx --devices HETERO:GPU,CPU --supports GPU=gpu.txt --dump-dir dumps
//! tessera run model.onnx --devices HETERO:CPU --local --random --output-dir out --perf-counts
//! tessera certs init --dir certs --cluster lab --nodes coordinator,node-a,node-b,client
//! ```

mod certs;
mod partition;
mod run;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Tessera: distributed heterogeneous ONNX inference"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Assign devices to nodes and cut the model into subgraphs (dry run).
    Partition(partition::PartitionArgs),
    /// Run one inference through HETERO on this machine's plugins.
    Run(run::RunArgs),
    /// Cluster certificates (mutual TLS between all nodes).
    #[command(subcommand)]
    Certs(certs::CertsCommand),
}

/// Writes to stdout; a closed pipe (`tessera ... | head`) is not an error.
pub(crate) fn print_stdout(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write to stdout: {e}");
        }
    }
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Partition(args) => partition::run(args),
        Command::Run(args) => run::run(args),
        Command::Certs(command) => certs::run(command),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
