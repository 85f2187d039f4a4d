//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use tessera_common::affinity::{
    assign, AffinityRequest, AnalyticCostModel, Assignment, DeviceId, DevicePriority, Policy,
    SupportSet,
};
use tessera_common::graph::Graph;
use tessera_common::partition::{partition, Algorithm, Partition, PartitionOptions};
use tessera_common::synth::{model_from_dag, Dag};

pub fn graph_from(nodes: usize, edges: &[(u32, u32)], names: Option<&[&str]>) -> Graph {
    let dag = Dag {
        nodes,
        edges: edges.to_vec(),
    };
    Graph::from_model(model_from_dag(&dag, names)).expect("synthetic model is valid")
}

/// Assigns with the priority policy; `supports` lists (device, set).
pub fn assign_priority(
    graph: &Graph,
    priority: &str,
    supports: Vec<(&str, SupportSet)>,
) -> Assignment {
    let priority = DevicePriority::parse(priority).unwrap();
    let supports: HashMap<DeviceId, SupportSet> = supports
        .into_iter()
        .map(|(d, s)| (DeviceId::parse(d).unwrap(), s))
        .collect();
    let model = AnalyticCostModel::default();
    assign(
        graph,
        &AffinityRequest {
            priority: &priority,
            supports: &supports,
            manual: &BTreeMap::new(),
            policy: Policy::Priority,
            strict: false,
            cost_model: &model,
        },
    )
    .unwrap()
}

pub fn run(graph: &Graph, a: &Assignment, algorithm: Algorithm, merge: bool) -> Partition {
    partition(
        graph,
        a,
        PartitionOptions {
            algorithm,
            merge,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The subgraphs as (device, sorted node names), sorted.
pub fn groups(graph: &Graph, p: &Partition) -> BTreeSet<(String, Vec<String>)> {
    p.subgraphs
        .iter()
        .map(|sg| {
            let mut names: Vec<String> = sg
                .nodes
                .iter()
                .map(|&n| graph.node(n).name.clone())
                .collect();
            names.sort();
            (p.device_of(sg).to_string(), names)
        })
        .collect()
}

pub fn set(items: &[(&str, &[&str])]) -> BTreeSet<(String, Vec<String>)> {
    items
        .iter()
        .map(|(d, ns)| {
            let mut v: Vec<String> = ns.iter().map(|s| s.to_string()).collect();
            v.sort();
            (d.to_string(), v)
        })
        .collect()
}

/// Folder of the real test models (`scripts/fetch-test-models.sh`).
pub fn models_dir() -> PathBuf {
    std::env::var_os("TESSERA_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/models")))
}

/// The real models; fails with instructions if they were not fetched.
pub fn real_models() -> Vec<PathBuf> {
    let dir = models_dir();
    let names = [
        "ch_PP-OCRv4_det_infer.onnx",
        "ch_PP-OCRv4_rec_infer.onnx",
        "ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "magika_standard_v3_3.onnx",
    ];
    names
        .iter()
        .map(|n| {
            let p = dir.join(n);
            assert!(
                p.exists(),
                "missing test model {}: run scripts/fetch-test-models.sh",
                p.display()
            );
            p
        })
        .collect()
}
