//! Partitioning benchmark (a figure printer, not a timed test):
//! `cargo bench -p tessera-common --bench partition [-- MAX_NODES]`.
//!
//! Random layered DAGs of 1k … 1M nodes over three devices (GPU, NPU, CPU;
//! every node is given one of ten op kinds; GPU supports seven kinds, NPU
//! four, CPU all; priority GPU, NPU, CPU). Prints nodes, edges, subgraph
//! counts and milliseconds for `fast` (as users get it: the strategy
//! portfolio up to 50k nodes), `fast-linear` (the strictly linear variant
//! used above that), `fast` without the merge pass, and `reference` (only
//! while it stays well under a minute).

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
        if std::env::var_os("PHASES").is_some() {
            use tessera_common::partition::{assemble, fast, merge, op_dag, validate};
            let t = Instant::now();
            let d = op_dag(&graph, &a).unwrap();
            let t1 = t.elapsed();
            let l = fast::select(&d, fast::JoinRule::Rank);
            let t2 = t.elapsed();
            let l2 = fast::select(&d, fast::JoinRule::Exact);
            let t3 = t.elapsed();
            let m = merge::merge(&d, &l);
            let t4 = t.elapsed();
            let m2 = merge::merge(&d, &(0..n as u32).collect::<Vec<_>>());
            let t5 = t.elapsed();
            let p = assemble(&graph, &a.devices, &d, &m);
            let t6 = t.elapsed();
            validate(&graph, &a, &p).unwrap();
            let t7 = t.elapsed();
            println!("phases: opdag {t1:?} rank {:?} exact {:?} merge {:?} merge-singletons {:?} assemble {:?} validate {:?} ({} {})", t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, l2.len(), m2.len());
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
