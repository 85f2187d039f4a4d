//! Partitioning benchmark (a figure printer, not a timed test):
//! `cargo bench -p tessera-common --bench partition [-- MAX_NODES | --only N]`;
//! `TESSERA_BENCH_PHASES=1` also times the phases of the linear pipeline.
//!
//! Random layered DAGs of 1k … 1M nodes over three devices (GPU, NPU, CPU;
//! every node is given one of ten op kinds; GPU supports seven kinds, NPU
//! four, CPU all; priority GPU, NPU, CPU). Prints nodes, edges, subgraph
//! counts and milliseconds for `fast` (as users get it: the strategy
//! portfolio up to 50k nodes), `fast-linear` (the strictly linear variant
//! used above that), `fast` without the merge pass, and `reference` (only
//! while it stays well under a minute).

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use tessera_common::affinity::{
    assign, AffinityRequest, AnalyticCostModel, DeviceId, DevicePriority, Policy, SupportSet,
};
use tessera_common::graph::Graph;
use tessera_common::partition::{partition, Algorithm, PartitionOptions};
use tessera_common::synth::{layered_dag, model_from_dag, Rng};

fn main() {
    let max: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    println!(
        "{:>9} {:>9} {:<16} {:>10} {:>10}",
        "nodes", "edges", "algorithm", "subgraphs", "ms"
    );
    let mut reference_ms = 0.0;
    let mut fast_ms: Vec<(usize, f64)> = Vec::new();
    // `--only N` benchmarks just that size.
    let only: Option<usize> = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .and_then(|a| a.parse().ok());
    let mut n = only.unwrap_or(1_000);
    while n <= only.unwrap_or(max) {
        let mut rng = Rng::new(n as u64);
        let dag = layered_dag(n, 64, &mut rng);
        let graph = Graph::from_model(model_from_dag(&dag, None)).expect("synthetic model");
        let kinds: Vec<u64> = (0..n).map(|_| rng.below(10)).collect();
        let names = |keep: &dyn Fn(u64) -> bool| -> SupportSet {
            SupportSet::from_nodes((0..n).filter(|&i| keep(kinds[i])).map(|i| format!("n{i}")))
        };
        let supports = HashMap::from([
            (DeviceId::parse("GPU").unwrap(), names(&|k| k < 7)),
            (DeviceId::parse("NPU").unwrap(), names(&|k| k >= 5)),
            (DeviceId::parse("CPU").unwrap(), SupportSet::all()),
        ]);
        let priority = DevicePriority::parse("HETERO:GPU,NPU,CPU").unwrap();
        let cost = AnalyticCostModel::default();
        let req = AffinityRequest {
            priority: &priority,
            supports: &supports,
            manual: &BTreeMap::new(),
            policy: Policy::Priority,
            strict: false,
            cost_model: &cost,
        };
        let a = assign(&graph, &req).expect("assignment");
        if std::env::var_os("TESSERA_BENCH_PHASES").is_some() {
            print_phases(&graph, &a);
        }
        let portfolio = PartitionOptions::default().portfolio_max_nodes;
        let mut runs = vec![
            ("fast", Algorithm::Fast, true, portfolio),
            ("fast-linear", Algorithm::Fast, true, 0),
            ("fast (no merge)", Algorithm::Fast, false, 0),
        ];
        if n <= 10_000 && reference_ms < 600.0 {
            runs.push(("reference", Algorithm::Reference, false, 0));
        }
        for (label, algorithm, merge, portfolio_max_nodes) in runs {
            let start = Instant::now();
            let p = partition(
                &graph,
                &a,
                PartitionOptions {
                    algorithm,
                    merge,
                    portfolio_max_nodes,
                },
            )
            .expect("partition");
            let ms = start.elapsed().as_secs_f64() * 1e3;
            println!(
                "{n:>9} {:>9} {label:<16} {:>10} {ms:>10.1}",
                dag.edges.len(),
                p.subgraphs.len()
            );
            match label {
                "reference" => reference_ms = ms,
                "fast-linear" => fast_ms.push((n, ms)),
                _ => {}
            }
        }
        n *= 10;
    }
    for w in fast_ms.windows(2) {
        println!(
            "fast-linear: x10 nodes ({} -> {}) took x{:.2} time ({:.2} per x10 beyond linear)",
            w[0].0,
            w[1].0,
            w[1].1 / w[0].1,
            w[1].1 / w[0].1 / 10.0
        );
    }
}

/// Times the phases of the linear pipeline separately
/// (`TESSERA_BENCH_PHASES=1`).
fn print_phases(graph: &Graph, a: &tessera_common::affinity::Assignment) {
    use tessera_common::partition::{assemble, fast, merge, op_dag, validate};
    let t = Instant::now();
    let dag = op_dag(graph, a).expect("op dag");
    let t_dag = t.elapsed();
    let labels = fast::select(&dag, fast::JoinRule::Rank);
    let t_select = t.elapsed();
    let merged = merge::merge_in_order(&dag, &labels, merge::MergeOrder::Local);
    let t_merge = t.elapsed();
    let p = assemble(graph, &a.devices, &dag, &merged);
    let t_assemble = t.elapsed();
    validate(graph, a, &p).expect("valid");
    let t_validate = t.elapsed();
    println!(
        "phases: op-dag {:.1} ms, select {:.1} ms, merge {:.1} ms, assemble {:.1} ms, validate {:.1} ms",
        t_dag.as_secs_f64() * 1e3,
        (t_select - t_dag).as_secs_f64() * 1e3,
        (t_merge - t_select).as_secs_f64() * 1e3,
        (t_assemble - t_merge).as_secs_f64() * 1e3,
        (t_validate - t_assemble).as_secs_f64() * 1e3
    );
}
