//! Memory-aware placement: the need model, pipelined stages that fit each
//! device, balanced by speed, and the errors when nothing fits. The
//! figures are exact: a chain of 2048×2048 f32 layers weighs 16 MiB a
//! layer.

use std::collections::{BTreeMap, HashMap};

use tessera_common::affinity::{
    AnalyticCostModel, DeviceId, DevicePriority, DeviceProfile, Policy, Rule, SupportSet,
};
use tessera_common::graph::Graph;
use tessera_common::memory::{parse_size, NeedModel};
use tessera_common::plan::{plan, prepare, Plan, PlanError, PlanOptions};
use tessera_common::synth::matmul_chain_zeros;

const MIB: u64 = 1 << 20;

fn device(s: &str) -> DeviceId {
    DeviceId::parse(s).unwrap()
}

/// The chain with its batch fixed (so activations are exact).
fn chain(layers: usize, batch: usize) -> Graph {
    let shapes = BTreeMap::from([("x".to_string(), vec![batch, 2048])]);
    prepare(&matmul_chain_zeros(layers, 2048), &shapes)
        .unwrap()
        .0
}

/// Plans `graph` over `devices` (name, memory, GFLOP/s) with the cost
/// policy's speeds.
fn plan_over(graph: &Graph, devices: &[(&str, Option<u64>, f64)]) -> Result<Plan, PlanError> {
    let ids: Vec<DeviceId> = devices.iter().map(|(d, _, _)| device(d)).collect();
    let supports: HashMap<DeviceId, SupportSet> =
        ids.iter().map(|d| (d.clone(), SupportSet::all())).collect();
    let mut cost = AnalyticCostModel::default();
    for (d, _, gflops) in devices {
        cost.devices.insert(
            device(d),
            DeviceProfile {
                gflops: *gflops,
                mem_gbps: 20.0,
                launch_us: 2.0,
            },
        );
    }
    let options = PlanOptions {
        priority: DevicePriority { devices: ids },
        policy: Policy::Priority,
        memory: devices
            .iter()
            .filter_map(|(d, m, _)| Some((device(d), (*m)?)))
            .collect(),
        ..Default::default()
    };
    plan(graph, &supports, &cost, &options)
}

/// Layers (MatMul nodes) per device, in stage order.
fn layers_per_stage(plan: &Plan, graph: &Graph) -> Vec<(String, usize)> {
    plan.partition
        .subgraphs
        .iter()
        .map(|sg| {
            let mm = sg
                .nodes
                .iter()
                .filter(|&&n| graph.node(n).op_type == "MatMul")
                .count();
            (plan.partition.device_of(sg).to_string(), mm)
        })
        .collect()
}

#[test]
fn the_need_model_counts_weights_once_and_activations_at_their_peak() {
    let graph = chain(8, 1);
    let need = NeedModel::new(&graph, 1, &BTreeMap::new());
    let all = need.subgraph_need(graph.topo_ops(), &graph.outputs);
    assert_eq!(all.weights, 128 * MIB);
    // At most two [1,2048] f32 tensors alive at once: 16 KiB.
    assert_eq!(all.activations, 16 << 10);
    // At batch 64 (a dynamic batch counted at the largest batch).
    let dynamic = Graph::from_model(matmul_chain_zeros(2, 2048)).unwrap();
    let at_64 = NeedModel::new(&dynamic, 64, &BTreeMap::new());
    let n = at_64.subgraph_need(dynamic.topo_ops(), &dynamic.outputs);
    assert_eq!(n.activations, 2 * 64 * 2048 * 4);
    // A weight read by two nodes is counted once.
    let shared = tied_weights();
    let need = NeedModel::new(&shared, 1, &BTreeMap::new());
    assert_eq!(
        need.subgraph_need(shared.topo_ops(), &shared.outputs)
            .weights,
        16 * MIB
    );
    // Declared state counts for its node.
    let state = BTreeMap::from([("mm2".to_string(), 3 * MIB)]);
    let with_state = NeedModel::new(&graph, 1, &state);
    assert_eq!(
        with_state
            .subgraph_need(graph.topo_ops(), &graph.outputs)
            .state,
        3 * MIB
    );
}

/// Two MatMuls reading one 16 MiB weight.
fn tied_weights() -> Graph {
    let mut model = matmul_chain_zeros(2, 2048);
    let g = model.graph.as_mut().unwrap();
    g.node[2].input[1] = "w1".into();
    g.initializer.truncate(1);
    Graph::from_model(model).unwrap()
}

#[test]
fn a_model_that_fits_stays_as_the_policy_placed_it() {
    let graph = chain(8, 1);
    let p = plan_over(
        &graph,
        &[
            ("a/CPU", Some(256 * MIB), 50.0),
            ("b/CPU", Some(256 * MIB), 50.0),
        ],
    )
    .unwrap();
    assert!(p.memory.pipelined.is_none());
    assert_eq!(layers_per_stage(&p, &graph), [("a/CPU".to_string(), 8)]);
    assert_eq!(p.memory.devices[0].need.weights, 128 * MIB);
    assert_eq!(p.memory.devices[0].offered, Some(256 * MIB));
}

#[test]
fn a_model_too_big_for_one_device_is_cut_into_stages_that_each_fit() {
    let graph = chain(8, 1);
    let devices = [
        ("a/CPU", Some(64 * MIB), 50.0),
        ("b/CPU", Some(64 * MIB), 50.0),
        ("c/CPU", Some(64 * MIB), 50.0),
    ];
    let p = plan_over(&graph, &devices).unwrap();
    let stages = layers_per_stage(&p, &graph);
    // 4 layers are exactly 64 MiB, plus activations: 3 at most a device.
    assert_eq!(stages.iter().map(|(_, n)| n).sum::<usize>(), 8);
    assert!(stages.iter().all(|(_, n)| *n <= 3), "{stages:?}");
    assert_eq!(stages.len(), 3, "{stages:?}");
    for d in &p.memory.devices {
        assert!(d.need.total() <= 64 * MIB, "{d:?}");
    }
    let pipelined = p.memory.pipelined.as_ref().unwrap();
    assert!(
        pipelined.reason.contains("64.0 MiB"),
        "{}",
        pipelined.reason
    );
    assert_eq!(pipelined.stages.len(), 3);
    // Every node says why it went where.
    assert!(p
        .assignment
        .explanations
        .iter()
        .all(|e| matches!(e.rule, Rule::Memory { .. })));
    // Stages form a chain: each reads only the one before.
    for (i, s) in p.stages.iter().enumerate() {
        assert_eq!(s.deps, (0..i).rev().take(1).collect::<Vec<_>>());
    }
}

#[test]
fn memory_gives_about_a_two_to_one_split() {
    // 96 MiB holds 5 layers at most and 48 MiB 2 (each also holds its
    // activations): the 6-layer chain goes 4:2.
    let graph = chain(6, 1);
    let p = plan_over(
        &graph,
        &[
            ("a/CPU", Some(96 * MIB), 50.0),
            ("b/CPU", Some(48 * MIB), 50.0),
        ],
    )
    .unwrap();
    let stages = layers_per_stage(&p, &graph);
    assert_eq!(
        stages,
        [("a/CPU".to_string(), 4), ("b/CPU".to_string(), 2)],
        "{stages:?}"
    );
}

#[test]
fn a_device_twice_as_fast_gets_more_layers() {
    // Batch 64 makes each layer compute-bound (1 GFLOP), so speed counts.
    let graph = chain(8, 64);
    for (fast, slow) in [("a/CPU", "b/CPU"), ("b/CPU", "a/CPU")] {
        let speeds = |d: &str| if d == fast { 100.0 } else { 50.0 };
        let p = plan_over(
            &graph,
            &[
                ("a/CPU", Some(112 * MIB), speeds("a/CPU")),
                ("b/CPU", Some(112 * MIB), speeds("b/CPU")),
            ],
        )
        .unwrap();
        let stages: BTreeMap<String, usize> = layers_per_stage(&p, &graph).into_iter().collect();
        assert!(stages[fast] > stages[slow], "{stages:?}");
        assert_eq!(stages[fast] + stages[slow], 8);
    }
}

#[test]
fn a_cluster_that_cannot_hold_the_model_is_one_clear_error() {
    let graph = chain(8, 1);
    let err = plan_over(
        &graph,
        &[
            ("a/CPU", Some(32 * MIB), 50.0),
            ("b/CPU", Some(32 * MIB), 50.0),
            ("c/CPU", Some(32 * MIB), 50.0),
        ],
    )
    .unwrap_err();
    let PlanError::Memory(fit) = &err else {
        panic!("expected a memory error, got {err}");
    };
    assert_eq!(fit.need.weights, 128 * MIB);
    assert_eq!(fit.offered, Some(96 * MIB));
    assert_eq!(fit.largest, 16 * MIB + (16 << 10));
    let text = err.to_string();
    for part in [
        "128.0 MiB",
        "96.0 MiB",
        "a/CPU 32.0 MiB",
        "16.0 MiB",
        "'mm1'",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
}

#[test]
fn a_node_bigger_than_any_device_is_named() {
    let graph = chain(2, 1);
    let err = plan_over(
        &graph,
        &[("a/CPU", Some(8 * MIB), 50.0), ("b/CPU", None, 50.0)],
    );
    // b has no limit: it takes the whole model.
    assert!(err.is_ok());
    let err = plan_over(
        &graph,
        &[
            ("a/CPU", Some(8 * MIB), 50.0),
            ("b/CPU", Some(12 * MIB), 50.0),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("more than any device that runs it offers (the most: 12.0 MiB on b/CPU)"),
        "{err}"
    );
}

#[test]
fn manual_affinity_that_does_not_fit_is_refused_not_moved() {
    let graph = chain(4, 1);
    let ids = [device("a/CPU"), device("b/CPU")];
    let supports: HashMap<DeviceId, SupportSet> =
        ids.iter().map(|d| (d.clone(), SupportSet::all())).collect();
    let options = PlanOptions {
        priority: DevicePriority {
            devices: ids.to_vec(),
        },
        manual: BTreeMap::from([("mm1".to_string(), device("a/CPU"))]),
        memory: HashMap::from([(device("a/CPU"), 40 * MIB), (device("b/CPU"), 40 * MIB)]),
        ..Default::default()
    };
    let err = plan(&graph, &supports, &AnalyticCostModel::default(), &options).unwrap_err();
    assert!(matches!(err, PlanError::ManualDoesNotFit(_)), "{err}");
    assert!(
        err.to_string().contains("drop the manual affinity"),
        "{err}"
    );
    assert_eq!(parse_size("40MiB").unwrap(), 40 * MIB);
}

#[test]
fn a_replan_keeps_the_stages_it_had_while_they_fit_and_predict_nearly_as_well() {
    let graph = chain(8, 1);
    let devices = [
        ("a/CPU", Some(64 * MIB), 50.0),
        ("b/CPU", Some(64 * MIB), 50.0),
        ("c/CPU", Some(64 * MIB), 50.0),
    ];
    let fresh = plan_over(&graph, &devices).unwrap();
    assert_eq!(
        layers_per_stage(&fresh, &graph)
            .iter()
            .map(|(_, n)| *n)
            .collect::<Vec<_>>(),
        [3, 3, 2]
    );
    // The placement it had: 2, 3, 3 layers. The same bottleneck (3
    // layers): kept.
    let previous: BTreeMap<String, DeviceId> = graph
        .topo_ops()
        .iter()
        .map(|&n| {
            let name = graph.node(n).name.clone();
            let layer: usize = name
                .trim_start_matches(|c: char| c.is_alphabetic())
                .parse()
                .unwrap();
            let d = match layer {
                1..=2 => "a/CPU",
                3..=5 => "b/CPU",
                _ => "c/CPU",
            };
            (name, device(d))
        })
        .collect();
    let again = plan_with_previous(&graph, &devices, previous.clone());
    assert_eq!(
        layers_per_stage(&again, &graph)
            .iter()
            .map(|(_, n)| *n)
            .collect::<Vec<_>>(),
        [2, 3, 3]
    );
    // c offers less now: the old stages no longer fit, a new cut is made.
    let shrunk = [devices[0], devices[1], ("c/CPU", Some(40 * MIB), 50.0)];
    let moved = plan_with_previous(&graph, &shrunk, previous);
    let split: Vec<usize> = layers_per_stage(&moved, &graph)
        .iter()
        .map(|(_, n)| *n)
        .collect();
    assert_eq!(split.iter().sum::<usize>(), 8);
    assert!(split[2] <= 2, "{split:?}");
}

fn plan_with_previous(
    graph: &Graph,
    devices: &[(&str, Option<u64>, f64)],
    previous: BTreeMap<String, DeviceId>,
) -> Plan {
    let ids: Vec<DeviceId> = devices.iter().map(|(d, _, _)| device(d)).collect();
    let supports: HashMap<DeviceId, SupportSet> =
        ids.iter().map(|d| (d.clone(), SupportSet::all())).collect();
    let options = PlanOptions {
        priority: DevicePriority { devices: ids },
        memory: devices
            .iter()
            .filter_map(|(d, m, _)| Some((device(d), (*m)?)))
            .collect(),
        previous,
        ..Default::default()
    };
    plan(graph, &supports, &AnalyticCostModel::default(), &options).unwrap()
}

#[test]
fn replicas_of_a_model_bigger_than_a_host_each_span_several_hosts() {
    use tessera_common::schedule::{schedule, Cluster, Replicas};
    let graph = chain(8, 1);
    let ids: Vec<DeviceId> = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .map(|h| device(&format!("{h}/CPU")))
        .collect();
    let supports: HashMap<DeviceId, SupportSet> =
        ids.iter().map(|d| (d.clone(), SupportSet::all())).collect();
    let cost = AnalyticCostModel::default();
    let options = PlanOptions {
        priority: DevicePriority {
            devices: ids.clone(),
        },
        memory: ids.iter().map(|d| (d.clone(), 64 * MIB)).collect(),
        ..Default::default()
    };
    let cluster = Cluster {
        graph: &graph,
        supports: &supports,
        cost: &cost,
    };
    // Two copies of three hosts each.
    let two = schedule(&cluster, &options, Replicas::Count(2)).unwrap();
    assert_eq!(two.copies.len(), 2);
    for copy in &two.copies {
        assert_eq!(copy.plan.stages.len(), 3, "{:?}", copy.hosts);
        assert!(copy
            .plan
            .memory
            .devices
            .iter()
            .all(|d| d.need.total() <= 64 * MIB));
    }
    // Three copies would need 2 hosts' 128 MiB each: refused, naming memory.
    let err = schedule(&cluster, &options, Replicas::Count(3))
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not fit the devices' memory"), "{err}");
    // auto weighs the counts and keeps a count whose groups hold a copy.
    let auto = schedule(&cluster, &options, Replicas::Auto).unwrap();
    assert!(auto.copies.len() <= 2, "{}", auto.copies.len());
    assert!(auto.considered.iter().any(|c| c.predicted_rps.is_none()));
}

#[test]
fn a_model_that_declares_its_layers_is_cut_between_them_only() {
    // Decoder layer j is chain layers 2j+1 and 2j+2 (32 MiB): its nodes
    // named /model/layers.j/…, as the metadata says.
    let mut model = matmul_chain_zeros(8, 2048);
    let graph_proto = model.graph.as_mut().unwrap();
    for n in &mut graph_proto.node {
        let name = n.name.clone().unwrap();
        let k: usize = name
            .trim_start_matches(|c: char| c.is_alphabetic())
            .parse()
            .unwrap();
        n.name = Some(format!("/model/layers.{}/{name}", (k - 1) / 2));
    }
    model
        .metadata_props
        .push(tessera_common::onnx::proto::StringStringEntryProto {
            key: Some(tessera_common::graph::LAYER_PREFIX_KEY.into()),
            value: Some("/model/layers.".into()),
        });
    let shapes = BTreeMap::from([("x".to_string(), vec![1, 2048])]);
    let graph = prepare(&model, &shapes).unwrap().0;
    assert_eq!(graph.layers().len(), 4);
    // Three devices of 96 MiB: balanced by chain layers the stages would
    // be 3/3/2; whole decoder layers make them even.
    let devices = [
        ("a/CPU", Some(96 * MIB), 50.0),
        ("b/CPU", Some(96 * MIB), 50.0),
        ("c/CPU", Some(96 * MIB), 50.0),
    ];
    let p = plan_over(&graph, &devices).unwrap();
    let stages = layers_per_stage(&p, &graph);
    assert!(stages.iter().all(|(_, n)| n % 2 == 0), "{stages:?}");
    for layer in graph.layers() {
        let devices: std::collections::HashSet<String> = layer
            .iter()
            .map(|&n| {
                let sg = p
                    .partition
                    .subgraphs
                    .iter()
                    .find(|sg| sg.nodes.contains(&n))
                    .unwrap();
                p.partition.device_of(sg).to_string()
            })
            .collect();
        assert_eq!(devices.len(), 1, "a layer spans {devices:?}");
    }
}
