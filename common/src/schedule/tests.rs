use std::collections::HashMap;

use super::*;
use crate::affinity::{DevicePriority, LinkProfile, Policy};
use crate::synth::small_cnn;

fn device(s: &str) -> DeviceId {
    DeviceId::parse(s).unwrap()
}

fn options(devices: &[DeviceId], policy: Policy) -> PlanOptions {
    PlanOptions {
        priority: DevicePriority {
            devices: devices.to_vec(),
        },
        policy,
        ..Default::default()
    }
}

fn all_of(devices: &[DeviceId]) -> HashMap<DeviceId, SupportSet> {
    devices
        .iter()
        .map(|d| (d.clone(), SupportSet::all()))
        .collect()
}

/// What a [`Cluster`] borrows: the small CNN, the default cost model.
struct Fixture {
    graph: Graph,
    supports: HashMap<DeviceId, SupportSet>,
    cost: AnalyticCostModel,
}

impl Fixture {
    fn new(supports: HashMap<DeviceId, SupportSet>) -> Fixture {
        Fixture {
            graph: Graph::from_model(small_cnn(1)).unwrap(),
            supports,
            cost: AnalyticCostModel::default(),
        }
    }

    fn cluster(&self) -> Cluster<'_> {
        Cluster {
            graph: &self.graph,
            supports: &self.supports,
            cost: &self.cost,
        }
    }
}

#[test]
fn auto_runs_a_whole_copy_on_each_of_two_equal_workers() {
    let devices = [device("a/CPU"), device("b/CPU")];
    let supports = all_of(&devices);
    let fixture = Fixture::new(supports);
    let cluster = fixture.cluster();
    let one = schedule(
        &cluster,
        &options(&devices, Policy::Cost),
        Replicas::Count(1),
    )
    .unwrap();
    let auto = schedule(&cluster, &options(&devices, Policy::Cost), Replicas::Auto).unwrap();
    assert_eq!(auto.copies.len(), 2);
    let hosts: Vec<&[String]> = auto.copies.iter().map(|c| c.hosts.as_slice()).collect();
    assert_eq!(hosts, [["a".to_string()], ["b".to_string()]]);
    // Two disjoint copies: twice one copy's throughput.
    assert!((auto.predicted_rps / one.predicted_rps - 2.0).abs() < 1e-9);
    assert_eq!(auto.considered.len(), 2);
    assert!(auto.considered.iter().all(|c| c.predicted_rps.is_some()));
}

#[test]
fn more_copies_than_hosts_share_them_and_predict_no_more() {
    let devices = [device("a/CPU"), device("b/CPU")];
    let supports = all_of(&devices);
    let fixture = Fixture::new(supports);
    let cluster = fixture.cluster();
    let opts = options(&devices, Policy::Priority);
    let two = schedule(&cluster, &opts, Replicas::Count(2)).unwrap();
    let three = schedule(&cluster, &opts, Replicas::Count(3)).unwrap();
    let hosts: Vec<String> = three.copies.iter().map(|c| c.hosts.join(",")).collect();
    assert_eq!(hosts, ["a", "b", "a"]);
    assert_eq!(three.predicted_rps, two.predicted_rps);
}

/// Host `a` has only a GPU that cannot run Softmax, `b` a CPU: in strict
/// mode no copy can run on `a` alone, so `auto` keeps one copy split over both.
#[test]
fn auto_splits_a_copy_when_no_host_can_run_it_alone() {
    let devices = [device("a/GPU"), device("b/CPU")];
    let mut supports = all_of(&devices);
    let mut gpu = SupportSet::default();
    for t in [
        "Conv",
        "Relu",
        "MaxPool",
        "GlobalAveragePool",
        "Flatten",
        "Gemm",
    ] {
        gpu.op_types.insert(t.into());
    }
    supports.insert(device("a/GPU"), gpu);
    let fixture = Fixture::new(supports);
    let cluster = fixture.cluster();
    let opts = PlanOptions {
        strict: true,
        ..options(&devices, Policy::Priority)
    };
    let auto = schedule(&cluster, &opts, Replicas::Auto).unwrap();
    assert_eq!(auto.copies.len(), 1);
    assert_eq!(auto.copies[0].cost.device_us.len(), 2, "a pipelined copy");
    let two = &auto.considered[1];
    assert_eq!((two.copies, two.predicted_rps), (2, None));
    assert!(two.note.contains("replica 1 of 2 (on a)"), "{}", two.note);
    // Asked for two, the error says which copy and why.
    let err = schedule(&cluster, &opts, Replicas::Count(2)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("replica 1 of 2 (on a)") && text.contains("softmax"),
        "{text}"
    );
}

#[test]
fn replicas_that_do_not_fit_name_the_device_and_the_bytes() {
    let devices = [device("a/CPU")];
    let supports = all_of(&devices);
    let fixture = Fixture::new(supports);
    // small_cnn: about 57 KB of weights and 0.5 MB of activations a copy.
    let cluster = fixture.cluster();
    let mut opts = options(&devices, Policy::Priority);
    opts.memory = HashMap::from([(device("a/CPU"), 1_000_000u64)]);
    assert!(schedule(&cluster, &opts, Replicas::Count(1)).is_ok());
    let err = schedule(&cluster, &opts, Replicas::Count(2)).unwrap_err();
    match &err {
        ScheduleError::Memory {
            device,
            copies,
            have,
            ..
        } => assert_eq!((device.as_str(), *copies, *have), ("a/CPU", 2, 1_000_000)),
        other => panic!("expected a memory error, got {other}"),
    }
}

#[test]
fn replicas_read_as_a_number_or_auto() {
    assert_eq!("auto".parse::<Replicas>(), Ok(Replicas::Auto));
    assert_eq!("4".parse::<Replicas>(), Ok(Replicas::Count(4)));
    assert!("0".parse::<Replicas>().unwrap_err().contains("at least 1"));
    assert!("many".parse::<Replicas>().unwrap_err().contains("'many'"));
    let json = serde_json::to_string(&Replicas::Auto).unwrap();
    assert_eq!(json, "\"auto\"");
    assert_eq!(
        serde_json::from_str::<Replicas>("\"3\"").unwrap(),
        Replicas::Count(3)
    );
    let wire = bincode::serialize(&Replicas::Count(7)).unwrap();
    assert_eq!(
        bincode::deserialize::<Replicas>(&wire).unwrap(),
        Replicas::Count(7)
    );
}

#[test]
fn host_links_add_latency_and_take_the_slower_bandwidth() {
    let mut cost = AnalyticCostModel::default();
    let link = |gbps, latency_us| LinkProfile { gbps, latency_us };
    cost.host_links.insert("a".into(), link(10.0, 50.0));
    cost.host_links.insert("b".into(), link(1.0, 20.0));
    let between = cost.between_hosts(Some("a"), Some("b"));
    assert_eq!((between.gbps, between.latency_us), (1.0, 70.0));
    // A host without its own profile: the shared inter-host one.
    assert_eq!(cost.between_hosts(Some("a"), Some("c")), cost.inter_host);
}

/// The scale the coordinator is built for, and beyond: 1,000 simulated
/// heterogeneous workers (seeded), every candidate count of copies planned.
/// Prints planning time and predicted throughput against the upper bound.
#[test]
fn a_thousand_simulated_workers_are_scheduled_within_the_bound() {
    let graph = Graph::from_model(small_cnn(1)).unwrap();
    let report = simulate::simulate(&graph, 1_000, 7, Replicas::Auto).unwrap();
    println!(
        "simulation: {} workers, {} devices, planned in {:.0} ms: {} copies ({} split), \
         predicted {:.0} req/s, bound {:.0} req/s, {:.2} of the bound",
        report.workers,
        report.devices,
        report.planning_ms,
        report.copies,
        report.split_copies,
        report.predicted_rps,
        report.upper_bound_rps,
        report.efficiency()
    );
    assert_eq!(report.workers, 1_000);
    assert!(report.devices > 1_100, "about one in four hosts has a GPU");
    assert!(
        report.efficiency() <= 1.0 + 1e-9,
        "the bound is an upper bound"
    );
    assert!(report.efficiency() > 0.5, "{report:?}");
    // Every candidate was weighed; the chosen one is the best of them.
    let best = report
        .considered
        .iter()
        .filter_map(|c| c.predicted_rps)
        .fold(0.0, f64::max);
    assert!(report.predicted_rps * 1.011 >= best);
    // The same seed gives the same cluster and the same answer.
    let again = simulate::simulate(&graph, 1_000, 7, Replicas::Auto).unwrap();
    assert_eq!(again.predicted_rps, report.predicted_rps);
}

/// A model that needs about 20 hosts' memory on 1,000 simulated workers:
/// every copy is cut into pipelined stages that fit, and `auto` weighs
/// how many such copies the cluster holds. Prints planning time and
/// predicted throughput against the (memory-blind) upper bound.
#[test]
fn a_model_needing_twenty_hosts_is_scheduled_on_a_thousand_simulated_workers() {
    // 64 layers of 1024×1024 f32: 256 MiB of weights (zero pages, never
    // touched: planning reads types and shapes).
    let graph = Graph::from_model(crate::synth::matmul_chain_zeros(64, 1024)).unwrap();
    let report = simulate::simulate_with_memory(&graph, 1_000, 7, Replicas::Auto, 20.0).unwrap();
    println!(
        "simulation with memory (a model needing ~20 hosts): {} workers, {} devices, planned in \
         {:.0} ms: {} copies of up to {} stages, predicted {:.0} req/s, memory-blind bound \
         {:.0} req/s, {:.2} of it",
        report.workers,
        report.devices,
        report.planning_ms,
        report.copies,
        report.most_stages,
        report.predicted_rps,
        report.upper_bound_rps,
        report.efficiency()
    );
    assert!(report.copies > 1, "{report:?}");
    assert_eq!(
        report.split_copies, report.copies,
        "no device holds a copy alone"
    );
    assert!(report.most_stages >= 10, "{report:?}");
    assert!(report.efficiency() <= 1.0 + 1e-9);
    // Counts whose groups cannot hold a copy were weighed and refused.
    assert!(report
        .considered
        .iter()
        .any(|c| c.predicted_rps.is_none() && c.note.contains("memory")));
}
