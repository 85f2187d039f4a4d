//! Real models (from PyPI wheels, see `scripts/fetch-test-models.sh`):
//! lossless round trip, IR construction, and export checked against
//! onnxruntime by `tests/python/check_split.py`.

use std::collections::{BTreeMap, HashMap};
use std::process::Command;

use crate::util::real_models;
use prost::Message;
use tessera_common::affinity::{
    assign, AffinityRequest, AnalyticCostModel, DeviceId, DevicePriority, Policy, SupportSet,
};
use tessera_common::graph::{Graph, NodeKind};
use tessera_common::onnx::{decode_model, encode_model, load_model};
use tessera_common::partition::{partition, Algorithm, PartitionOptions};
use tessera_common::synth::Rng;

#[test]
fn round_trip_is_lossless() {
    for path in real_models() {
        let bytes = std::fs::read(&path).unwrap();
        let model = decode_model(&bytes).unwrap();
        let encoded = encode_model(&model);
        let again = decode_model(&encoded).unwrap();
        assert_eq!(model, again, "{}", path.display());
        // Nothing was dropped: the re-encoding is as long as the original
        // (prost keeps no unknown fields, so a dropped field would shrink it).
        assert_eq!(encoded.len(), bytes.len(), "{}", path.display());
        assert_eq!(model.encoded_len(), bytes.len());
    }
}

#[test]
fn graphs_are_built_with_unique_names_and_types() {
    for path in real_models() {
        let g = Graph::from_model(load_model(&path).unwrap()).unwrap();
        let model_nodes = g.model().graph.as_ref().unwrap().node.len();
        assert_eq!(
            g.onnx_node_count(),
            model_nodes,
            "node names must be unique"
        );
        let constants = g
            .dag
            .node_weights()
            .filter(|n| n.kind == NodeKind::Constant && n.onnx_index.is_some())
            .count();
        assert_eq!(g.op_count() + constants, model_nodes);
        for &n in g.topo_ops() {
            assert_eq!(g.op_by_name(&g.node(n).name), Some(n));
        }
        // Element types are known for every op output (needed for export).
        let untyped: Vec<&str> = g
            .tensors
            .iter()
            .filter(|t| g.node(t.producer).kind == NodeKind::Op && t.elem_type.is_none())
            .map(|t| t.name.as_str())
            .collect();
        assert!(
            untyped.is_empty(),
            "{}: untyped tensors {untyped:?}",
            path.display()
        );
    }
}

/// Splits each real model over two devices with a seeded random support set,
/// exports every subgraph and lets onnxruntime run them in sequence against
/// the whole model (max abs diff ≤ 1e-5).
#[test]
fn exported_subgraphs_reproduce_the_model_in_onnxruntime() {
    let out_root = std::env::temp_dir().join(format!("tessera-export-{}", std::process::id()));
    for path in real_models() {
        let g = Graph::from_model(load_model(&path).unwrap()).unwrap();
        for (seed, algorithm) in [
            (1u64, Algorithm::Fast),
            (2, Algorithm::Fast),
            (3, Algorithm::Reference),
        ] {
            let mut rng = Rng::new(seed);
            let gpu: Vec<String> = g
                .topo_ops()
                .iter()
                .filter(|_| rng.chance(0.7))
                .map(|&n| g.node(n).name.clone())
                .collect();
            let priority = DevicePriority::parse("HETERO:GPU,CPU").unwrap();
            let supports = HashMap::from([
                (DeviceId::parse("GPU").unwrap(), SupportSet::from_nodes(gpu)),
                (DeviceId::parse("CPU").unwrap(), SupportSet::all()),
            ]);
            let cost = AnalyticCostModel::default();
            let req = AffinityRequest {
                priority: &priority,
                supports: &supports,
                manual: &BTreeMap::new(),
                policy: Policy::Priority,
                strict: true,
                cost_model: &cost,
            };
            let a = assign(&g, &req).unwrap();
            let p = partition(
                &g,
                &a,
                PartitionOptions {
                    algorithm,
                    merge: true,
                    ..Default::default()
                },
            )
            .unwrap();
            assert!(p.subgraphs.len() > 2);
            let dir = out_root.join(format!(
                "{}-{seed}",
                path.file_stem().unwrap().to_string_lossy()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let models = tessera_common::export::export_all(&g, &p).unwrap();
            for (i, m) in models.iter().enumerate() {
                tessera_common::onnx::save_model(m, dir.join(format!("subgraph_{i}.onnx")))
                    .unwrap();
            }
            let plan = tessera_common::dump::plan_report(&g, &a, &p);
            let plan_path = dir.join("plan.json");
            std::fs::write(&plan_path, serde_json::to_vec(&plan).unwrap()).unwrap();
            let out = Command::new("python3")
                .arg(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../tests/python/check_split.py"
                ))
                .arg(&path)
                .arg(&plan_path)
                .arg(&dir)
                .args(["--tol", "1e-5"])
                .output()
                .expect("python3 runs (install onnx and onnxruntime: see .ci/run)");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            println!(
                "{} seed {seed} {algorithm:?}: {}",
                path.display(),
                stdout.trim()
            );
            assert!(
                out.status.success(),
                "{}: {stdout}\n{stderr}",
                path.display()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out_root);
}
