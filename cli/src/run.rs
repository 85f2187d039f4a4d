//! `tessera run`: one inference. On a cluster (`--coordinator ADDR`), on an
//! embedded local cluster (the default: an in-process coordinator and
//! `--workers` workers over QUIC on loopback), or through HETERO on this
//! machine's plugins without any network (`--local`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use tessera_common::affinity::{DeviceId, DevicePriority, Policy};
use tessera_common::graph::Graph;
use tessera_common::partition::Algorithm;
use tessera_common::tensor::{read_npy, write_npy, Tensor};
use tessera_common::{onnx, synth};
use tessera_worker::hetero::{LoadOptions, Network};
use tessera_worker::plugin::{Config, DevicePlugin};
use tessera_worker::plugins;

#[derive(Args)]
pub struct RunArgs {
    /// The model: an ONNX file, or a GGUF file or generative model folder
    /// (its decoder graph, one step).
    pub(crate) model: PathBuf,
    /// Device priority list: HETERO:CPU, or on a cluster
    /// HETERO:node-a/CPU,node-b/CPU (a bare kind: that kind on every
    /// worker). Default: HETERO:CPU with --local, every device otherwise.
    #[arg(long)]
    pub(crate) devices: Option<String>,
    /// Run through HETERO in this process, without a cluster.
    #[arg(long, conflicts_with = "coordinator")]
    pub(crate) local: bool,
    #[command(flatten)]
    pub(crate) remote: crate::remote::RemoteArgs,
    /// Copies and batching (with a cluster).
    #[command(flatten)]
    pub(crate) serving: crate::remote::ServingArgs,
    /// NAME=FILE.npy for a model input.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    pub(crate) inputs: Vec<String>,
    /// Seeded random values for inputs not given with --input.
    #[arg(long)]
    pub(crate) random: bool,
    /// The seed of --random's values (the same seed, the same inputs).
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Write every output as `<name>.npy` here (characters outside
    /// A-Za-z0-9._- become _).
    #[arg(long)]
    pub(crate) output_dir: Option<PathBuf>,
    /// Print per-subgraph, per-node performance counters and a total.
    #[arg(long)]
    pub(crate) perf_counts: bool,
    /// priority or cost.
    #[arg(long, default_value = "priority")]
    pub(crate) policy: Policy,
    /// Subgraph selection algorithm: fast (a near-linear topological pass)
    /// or reference (OpenVINO's iterative algorithm).
    #[arg(long, default_value = "fast", value_parser = ["fast", "reference"])]
    pub(crate) algorithm: String,
    /// Fail if a node is supported by no device.
    #[arg(long)]
    pub(crate) strict: bool,
    /// Manual affinity JSON {"node": "DEVICE"}.
    #[arg(long)]
    pub(crate) affinity: Option<PathBuf>,
    /// NAME=d0,d1,...: a concrete shape for a graph input; the model is
    /// simplified for it (shape computations folded) and takes only inputs
    /// of that shape. Without it dynamic dims stay dynamic.
    #[arg(long = "shape", value_name = "NAME=d0,d1,...")]
    pub(crate) shapes: Vec<String>,
}

/// An output name as a file name: characters outside `A-Za-z0-9._-` → `_`.
pub fn output_file_name(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.npy")
}

pub fn run(args: RunArgs) -> Result<()> {
    if !args.local {
        return crate::remote::run(args);
    }
    let devices = args.devices.clone().unwrap_or_else(|| "HETERO:CPU".into());
    let model = if tessera_gguf::generative::is_generative(&args.model) {
        onnx::decode_model_shared(tessera_cli::read_model(&args.model, 1)?.bytes)?
    } else {
        onnx::load_model(&args.model)
            .with_context(|| format!("loading {}", args.model.display()))?
    };
    let priority = DevicePriority::parse(&devices).context("--devices")?;
    let mut plugin_list: Vec<(DeviceId, Arc<dyn DevicePlugin>)> = Vec::new();
    for d in &priority.devices {
        if d.host.is_some() {
            bail!("--devices {d}: devices on other hosts need a cluster; --local runs on this machine");
        }
        plugin_list.push((
            d.clone(),
            plugins::create(d.kind()).with_context(|| format!("device {d}"))?,
        ));
    }
    let graph = Graph::from_model(model.clone())?;
    let manual: BTreeMap<String, DeviceId> = match &args.affinity {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let manual = tessera_common::affinity::parse_manual_affinity(
                &text,
                &graph,
                &Default::default(),
                &priority,
            )?;
            // Simplification (at load) may fold more of the named nodes;
            // the planner skips those the same way.
            for unplaced in &manual.unplaced {
                eprintln!("note: {unplaced}");
            }
            manual
                .nodes
                .into_iter()
                .map(|(n, d)| (graph.node(n).name.clone(), d))
                .collect()
        }
        None => BTreeMap::new(),
    };
    let mut config = Config::default();
    if args.perf_counts {
        config.set("PERF_COUNT", "YES")?;
    }
    let options = LoadOptions {
        priority,
        policy: args.policy,
        algorithm: args
            .algorithm
            .parse::<Algorithm>()
            .map_err(anyhow::Error::msg)?,
        strict: args.strict,
        manual,
        config,
        shapes: tessera_cli::parse_shapes(&args.shapes)?,
    };
    let network = Network::load(model, &plugin_list, &options)?;

    let inputs = read_inputs(&args, network.graph())?;
    let result = network.run(&inputs)?;

    let mut out = String::new();
    use std::fmt::Write as _;
    let p = network.partition();
    let _ = writeln!(
        out,
        "{} subgraphs on {}; {:.2} ms",
        p.subgraphs.len(),
        devices,
        result.total.as_secs_f64() * 1e3
    );
    if !network.simplified().is_empty() {
        let _ = writeln!(out, "simplified: {}", network.simplified().summary());
    }
    if args.perf_counts {
        let mut total_us = 0;
        for (i, (device, time, counters)) in result.subgraphs.iter().enumerate() {
            let _ = writeln!(out, "subgraph{i} ({device}): {} µs", time.as_micros());
            for c in counters {
                let _ = writeln!(out, "subgraph{i}: {c}");
            }
            total_us += time.as_micros();
        }
        let _ = writeln!(out, "Total time: {total_us} microseconds");
    }
    for (name, t) in &result.outputs {
        let _ = writeln!(out, "output {name}: {} {:?}", t.elem(), t.shape());
    }
    write_outputs(&args, &result.outputs, &mut out)?;
    crate::print_stdout(&out);
    Ok(())
}

/// One `--input NAME=FILE.npy`.
pub fn input_file(spec: &str) -> Result<(String, Tensor)> {
    let (name, file) = spec
        .split_once('=')
        .with_context(|| format!("--input {spec}: expected NAME=FILE.npy"))?;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {file}"))?;
    let tensor = read_npy(&bytes).with_context(|| format!("--input {spec}"))?;
    Ok((name.to_string(), tensor))
}

/// The inputs from `--input` files, the rest random with `--random`.
pub fn read_inputs(args: &RunArgs, graph: &Graph) -> Result<HashMap<String, Tensor>> {
    let mut inputs: HashMap<String, Tensor> = HashMap::new();
    for spec in &args.inputs {
        let (name, tensor) = input_file(spec)?;
        inputs.insert(name, tensor);
    }
    if args.random {
        let generated = synth::random_inputs(graph, args.seed)
            .context("--random: an input has an unknown or non-numeric type")?;
        for (name, t) in generated {
            inputs.entry(name).or_insert(t);
        }
    }
    Ok(inputs)
}

/// Writes every output as `.npy` under `--output-dir`, if given.
pub fn write_outputs(args: &RunArgs, outputs: &[(String, Tensor)], out: &mut String) -> Result<()> {
    use std::fmt::Write as _;
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for (name, t) in outputs {
            let path = dir.join(output_file_name(name));
            std::fs::write(&path, write_npy(t)?)
                .with_context(|| format!("cannot write {}", path.display()))?;
            let _ = writeln!(out, "wrote {}", path.display());
        }
    }
    Ok(())
}
