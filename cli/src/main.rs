//! `tessera`: the command-line tool.
//!
//! Commands: `partition`, a dry run of Tessera's planner (affinity and
//! subgraph selection, explained and dumped as GraphViz and JSON, device
//! support from `--supports` files); `run --local`, one inference through
//! HETERO on this machine's plugins, inputs and outputs as `.npy`;
//! `run` on a cluster; `query`, `plan`, `bench`, `cluster`, `soak` (a
//! checked steady load for fault drills) against a cluster
//! (`--coordinator ADDR`) or an embedded local one; `load`, `models`,
//! `unload`, the named models of a running cluster; `generate`, text from
//! a language model folder; `ops`, what Tessera knows about each op type
//! and which backends run it; `certs init`,
//! the cluster CA and node certificates; `example-model`.
//!
//! ```text
//! tessera partition model.onnx --devices HETERO:GPU,CPU --supports GPU=gpu.txt --dump-dir dumps
//! tessera run model.onnx --devices HETERO:CPU --local --random --output-dir out --perf-counts
//! tessera run model.onnx --coordinator 127.0.0.1:7400 --devices HETERO:node-a/CPU,node-b/CPU --random
//! tessera plan model.onnx --devices CPU --policy cost --dump-dir dumps --explain
//! tessera bench model.onnx --requests 64 --concurrency 16 --shape x=1,3,48,320
//! tessera generate .cache/models/smollm2-135m-instruct --prompt "The capital of France is" --max-tokens 16
//! tessera load rec rec.onnx --coordinator 127.0.0.1:7400 --devices HETERO:node-a/CPU,node-b/CPU
//! tessera ops Conv LpPool
//! tessera certs init --dir certs --cluster lab --nodes coordinator,node-a,node-b,client
//! ```

mod certs;
mod cluster_cmds;
mod convert_cmd;
mod generate_cmd;
mod models_cmds;
mod ops_cmd;
mod partition;
mod progress;
mod remote;
mod run;
mod serve_cmd;
mod soak;

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
    /// The CPU backend of this process's plugins (`run --local`, embedded
    /// clusters): auto (onnxruntime where its library loads, else tract),
    /// tract or onnxruntime.
    #[arg(long, global = true, default_value = "auto")]
    cpu_backend: tessera_worker::plugins::CpuBackend,
    /// onnxruntime's shared library (libonnxruntime.so.1.32.0); default:
    /// ORT_DYLIB_PATH, then the installed onnxruntime Python package.
    #[arg(long, global = true)]
    onnxruntime_library: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Assign devices to nodes and cut the model into subgraphs (dry run).
    Partition(partition::PartitionArgs),
    /// Run one inference: on a cluster, an embedded local cluster, or
    /// (--local) through HETERO in this process.
    Run(run::RunArgs),
    /// QueryNetwork on every device of a cluster: which nodes each can run.
    Query(cluster_cmds::QueryArgs),
    /// Plan a model on a cluster without deploying it: the partition, why
    /// each node went where, predicted costs, .json/.dot dumps.
    Plan(cluster_cmds::PlanArgs),
    /// Throughput and latency with N requests in flight.
    Bench(cluster_cmds::BenchArgs),
    /// Generate text with a GGUF file or a generative model folder (a
    /// language model in the onnxruntime-genai layout), its layers spread
    /// over the cluster; the text goes to stdout as it comes.
    Generate(generate_cmd::GenerateArgs),
    /// Write a GGUF file as an onnxruntime-genai model folder.
    Convert(convert_cmd::ConvertArgs),
    /// A cluster's workers, devices, metrics and health.
    Cluster(cluster_cmds::ClusterArgs),
    /// Load a model under a name on a running cluster (its model
    /// repository): HTTP clients reach it by name, and it is re-planned by
    /// itself after a worker loss.
    Load(models_cmds::LoadArgs),
    /// The cluster's named models and their state.
    Models(models_cmds::ModelsArgs),
    /// Unload a named model.
    Unload(models_cmds::UnloadArgs),
    /// A steady load of checked requests (for fault drills): counts sent,
    /// succeeded, failed, lost and wrong answers.
    Soak(soak::SoakArgs),
    /// A gateway: KServe v2 (HTTP, gRPC) and OpenAI in front of a running
    /// cluster, its requests straight to the workers.
    Serve(serve_cmd::ServeArgs),
    /// What Tessera knows about each op type (type and shape inference,
    /// folding, decomposition, cost) and which backends run it.
    Ops(ops_cmd::OpsArgs),
    /// Cluster certificates (mutual TLS between all nodes).
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Write the bundled example model (a small seeded CNN) to a file, or
    /// with --chain a model bigger than a machine: LAYERS fully connected
    /// layers of --dim×--dim f32 weights (2048: 16 MiB a layer).
    ExampleModel {
        /// Where to write it.
        #[arg(long, default_value = "examples/models/small_cnn.onnx")]
        out: std::path::PathBuf,
        /// The seed of the weights (the same seed, the same model).
        #[arg(long, default_value_t = 7)]
        seed: u64,
        /// A chain of this many MatMul+Relu layers instead of the CNN.
        #[arg(long, value_name = "LAYERS")]
        chain: Option<usize>,
        /// The chain's width.
        #[arg(long, default_value_t = 2048)]
        dim: usize,
    },
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
    // Called `coordinator` or `worker` (the container image's links).
    if let Some(program) = std::env::args_os()
        .next()
        .and_then(|argv0| tessera_cli::daemons::Program::called(&argv0))
    {
        return program.run();
    }
    tessera_cli::tune_allocator();
    tessera_worker::crash::install();
    tessera_cli::quiet_vulkan_device_select();
    tessera_cli::init_tracing();
    let cli = Cli::parse();
    tessera_worker::plugins::configure(tessera_worker::plugins::PluginOptions {
        cpu_backend: cli.cpu_backend,
        onnxruntime_library: cli.onnxruntime_library.clone(),
        calibration_dir: None,
    });
    let result = match cli.command {
        Command::Partition(args) => partition::run(args),
        Command::Run(args) => run::run(args),
        Command::Query(args) => cluster_cmds::query(args),
        Command::Plan(args) => cluster_cmds::plan(args),
        Command::Bench(args) => cluster_cmds::bench(args),
        Command::Cluster(args) => cluster_cmds::cluster(args),
        Command::Generate(args) => generate_cmd::generate(args),
        Command::Convert(args) => convert_cmd::convert(args),
        Command::Load(args) => models_cmds::load(args),
        Command::Models(args) => models_cmds::models(args),
        Command::Unload(args) => models_cmds::unload(args),
        Command::Serve(args) => serve_cmd::serve(args),
        Command::Soak(args) => soak::soak(args),
        Command::Ops(args) => ops_cmd::ops(args),
        Command::Certs(command) => certs::run(command),
        Command::ExampleModel {
            out,
            seed,
            chain,
            dim,
        } => {
            let model = match chain {
                Some(0) => Err(anyhow::anyhow!("--chain needs at least one layer")),
                Some(_) if dim == 0 => Err(anyhow::anyhow!("--dim must be at least 1")),
                Some(layers) => Ok(tessera_common::synth::matmul_chain(layers, dim, seed)),
                None => Ok(tessera_common::synth::small_cnn(seed)),
            };
            model.and_then(|m| {
                tessera_common::onnx::save_model(&m, &out).map_err(anyhow::Error::from)
            })
        }
    };
    tessera_cli::exit(result)
}
