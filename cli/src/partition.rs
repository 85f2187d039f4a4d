//! `tessera partition`: affinity + subgraph selection, explained and dumped.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tessera_common::affinity::{
    assign, parse_manual_affinity, AffinityRequest, AnalyticCostModel, Assignment, DeviceId,
    DevicePriority, Policy, Rule, SupportSet,
};
use tessera_common::graph::{Graph, NodeId};
use tessera_common::partition::{partition, Algorithm, Partition, PartitionOptions};
use tessera_common::simplify::SimplifyReport;
use tessera_common::{dump, export, onnx};

#[derive(Args)]
pub struct PartitionArgs {
    /// The ONNX model.
    model: PathBuf,
    /// Device priority list, e.g. HETERO:GPU,CPU or HETERO:node-a/GPU.0,node-b/CPU.
    #[arg(long)]
    devices: String,
    /// DEVICE=FILE: nodes DEVICE supports, one per line (a node name, or
    /// op:TYPE for every node of a type). A device without a file supports
    /// every node.
    #[arg(long = "supports", value_name = "DEVICE=FILE")]
    supports: Vec<String>,
    /// JSON file of manual affinities {"node": "DEVICE"}; wins over the policy.
    #[arg(long)]
    affinity: Option<PathBuf>,
    /// How to choose among devices that support a node.
    /// priority or cost.
    #[arg(long, default_value = "priority")]
    policy: Policy,
    /// Subgraph selection algorithm.
    #[arg(long, default_value = "fast", value_parser = ["fast", "reference"])]
    algorithm: String,
    /// Skip the pass that merges adjacent subgraphs of the same device.
    #[arg(long)]
    no_merge: bool,
    /// Fail if any node is supported by no device (instead of falling back
    /// to the last device of the priority list).
    #[arg(long)]
    strict: bool,
    /// Write `<model>_affinity.dot`, `<model>_subgraphs.dot` and
    /// `<model>_subgraphs.json` here.
    #[arg(long)]
    dump_dir: Option<PathBuf>,
    /// Write each subgraph as a standalone ONNX model, `subgraph_<id>.onnx`.
    #[arg(long)]
    export_dir: Option<PathBuf>,
    /// Print only the summary, not every node's explanation.
    #[arg(long, short)]
    quiet: bool,
    /// NAME=d0,d1,...: a concrete shape for a graph input; the model is
    /// simplified for it (shape computations folded) and takes only inputs
    /// of that shape. Without it dynamic dims stay dynamic.
    #[arg(long = "shape", value_name = "NAME=d0,d1,...")]
    shapes: Vec<String>,
}

fn parse_supports(
    args: &[String],
    graph: &Graph,
    priority: &DevicePriority,
) -> Result<HashMap<DeviceId, SupportSet>> {
    let mut supports = HashMap::new();
    for arg in args {
        let (device, file) = arg
            .split_once('=')
            .with_context(|| format!("--supports {arg}: expected DEVICE=FILE"))?;
        let id = DeviceId::parse(device).with_context(|| format!("--supports {arg}"))?;
        if priority.position(&id).is_none() {
            bail!("--supports {arg}: device {id} is not in --devices {priority}");
        }
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read supports file {file}"))?;
        let set = SupportSet::parse(&text, graph, file)?;
        if supports.insert(id.clone(), set).is_some() {
            bail!("--supports given twice for {id}");
        }
    }
    for d in &priority.devices {
        supports.entry(d.clone()).or_insert_with(SupportSet::all);
    }
    Ok(supports)
}

fn model_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

/// Appends a line to the report.
macro_rules! outln {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

pub fn run(args: PartitionArgs) -> Result<()> {
    let mut out = String::new();
    let result = report(&args, &mut out);
    crate::print_stdout(&out);
    result
}

fn report(args: &PartitionArgs, out: &mut String) -> Result<()> {
    let started = Instant::now();
    let model = onnx::load_model(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let (graph, simplified) =
        tessera_common::plan::prepare(&model, &tessera_cli::parse_shapes(&args.shapes)?)
            .with_context(|| format!("building the graph of {}", args.model.display()))?;
    outln!(out, "simplification: {}", simplified.summary());
    tracing::info!(
        nodes = graph.op_count(),
        "model loaded in {:?}",
        started.elapsed()
    );
    let priority = DevicePriority::parse(&args.devices).context("--devices")?;
    let supports = parse_supports(&args.supports, &graph, &priority)?;
    let manual = read_manual_affinity(args, &graph, &simplified, &priority, out)?;
    let policy = args.policy;
    let algorithm: Algorithm = args.algorithm.parse().map_err(anyhow::Error::msg)?;
    let cost = AnalyticCostModel::default();
    let req = AffinityRequest {
        priority: &priority,
        supports: &supports,
        manual: &manual,
        policy,
        strict: args.strict,
        cost_model: &cost,
    };
    let t = Instant::now();
    let assignment = assign(&graph, &req)?;
    let affinity_time = t.elapsed();
    let t = Instant::now();
    let options = PartitionOptions {
        algorithm,
        merge: !args.no_merge,
        ..Default::default()
    };
    let p = partition(&graph, &assignment, options)?;
    let partition_time = t.elapsed();

    let name = model_stem(&args.model);
    outln!(
        out,
        "model {name}: {} nodes, devices {priority}, policy {policy}, algorithm {}{}",
        graph.op_count(),
        args.algorithm,
        if args.no_merge { " (no merge)" } else { "" }
    );
    print_subgraphs(out, &graph, &p);
    let times = [affinity_time, partition_time];
    print_summary(out, &graph, &p, &assignment, &priority, times);
    if !args.quiet {
        outln!(out, "explanation:");
        for e in &assignment.explanations {
            outln!(out, "  {}", assignment.explain(&graph, e));
        }
    }
    if let Some(dir) = &args.dump_dir {
        write_dumps(dir, &name, &graph, &assignment, &p, &simplified, out)?;
    }
    if let Some(dir) = &args.export_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let models = export::export_all(&graph, &p)?;
        for (i, m) in models.iter().enumerate() {
            onnx::save_model(m, dir.join(format!("subgraph_{i}.onnx")))?;
        }
        outln!(
            out,
            "exported {} subgraphs to {}",
            models.len(),
            dir.display()
        );
    }
    Ok(())
}

/// The manual affinity file of `--affinity`, read against the simplified
/// graph; names with nothing to place are reported.
fn read_manual_affinity(
    args: &PartitionArgs,
    graph: &Graph,
    simplified: &SimplifyReport,
    priority: &DevicePriority,
    out: &mut String,
) -> Result<BTreeMap<NodeId, DeviceId>> {
    let Some(path) = &args.affinity else {
        return Ok(BTreeMap::new());
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let manual = parse_manual_affinity(&text, graph, simplified, priority)
        .with_context(|| format!("affinity file {}", path.display()))?;
    for unplaced in &manual.unplaced {
        outln!(out, "{unplaced}");
    }
    Ok(manual.nodes)
}

/// One line per subgraph: device, size, dependencies, boundary tensors.
fn print_subgraphs(out: &mut String, graph: &Graph, p: &Partition) {
    for sg in &p.subgraphs {
        let names = |ts: &[tessera_common::graph::TensorId]| -> String {
            let v: Vec<&str> = ts.iter().map(|&t| graph.tensor(t).name.as_str()).collect();
            if v.len() > 6 {
                format!("{} … (+{})", v[..6].join(", "), v.len() - 6)
            } else {
                v.join(", ")
            }
        };
        outln!(
            out,
            "  subgraph {:>3}  {:<12} {:>5} nodes  after [{}]  in: {}  out: {}",
            sg.id,
            p.device_of(sg).to_string(),
            sg.nodes.len(),
            p.dependencies(graph, sg)
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(","),
            names(&sg.inputs),
            names(&sg.outputs)
        );
    }
}

/// Subgraphs and nodes per device, the planning times; nodes that fell
/// back for want of a supporting device.
fn print_summary(
    out: &mut String,
    graph: &Graph,
    p: &Partition,
    assignment: &Assignment,
    priority: &DevicePriority,
    [affinity_time, partition_time]: [std::time::Duration; 2],
) {
    let mut per_device: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for sg in &p.subgraphs {
        let e = per_device.entry(p.device_of(sg).to_string()).or_default();
        e.0 += 1;
        e.1 += sg.nodes.len();
    }
    let summary: Vec<String> = per_device
        .iter()
        .map(|(d, (s, n))| format!("{d}: {s} subgraphs, {n} nodes"))
        .collect();
    outln!(
        out,
        "{} subgraphs ({}); affinity {:.1} ms, partition {:.1} ms",
        p.subgraphs.len(),
        summary.join("; "),
        affinity_time.as_secs_f64() * 1e3,
        partition_time.as_secs_f64() * 1e3
    );
    let fallbacks: Vec<&str> = assignment
        .explanations
        .iter()
        .filter(|e| e.rule == Rule::Fallback)
        .map(|e| graph.node(e.node).name.as_str())
        .collect();
    if !fallbacks.is_empty() {
        outln!(
            out,
            "warning: {} node(s) supported by no device fell back to {}: {}",
            fallbacks.len(),
            priority
                .devices
                .last()
                .map(|d| d.to_string())
                .unwrap_or_default(),
            fallbacks.join(", ")
        );
    }
}

/// The affinity and subgraphs as GraphViz, and the plan as JSON, in `dir`.
fn write_dumps(
    dir: &Path,
    name: &str,
    graph: &Graph,
    assignment: &Assignment,
    p: &Partition,
    simplified: &SimplifyReport,
    out: &mut String,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let files = [
        (
            format!("{name}_affinity.dot"),
            dump::affinity_dot(graph, assignment),
        ),
        (
            format!("{name}_subgraphs.dot"),
            dump::subgraphs_dot(graph, p),
        ),
        (
            format!("{name}_subgraphs.json"),
            serde_json::to_string_pretty(&dump::PlanReport {
                simplified: simplified.clone(),
                ..dump::plan_report(graph, assignment, p)
            })?,
        ),
    ];
    for (file, text) in files {
        let path = dir.join(file);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        outln!(out, "wrote {}", path.display());
    }
    Ok(())
}
