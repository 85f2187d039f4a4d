//! The worked examples of the design sources, with exact subgraphs
//! asserted: OpenVINO's hetero subgraph-selection example (seven nodes)
//! and the example of TVM's partitioning RFC (a diamond with one node on
//! another backend).

use crate::util::*;
use tessera_common::affinity::SupportSet;
use tessera_common::partition::reference::{select_traced, Step};
use tessera_common::partition::{op_dag, Algorithm};

/// OpenVINO's hetero subgraph-selection example: nodes 1..7, edges 1→2, 2→3, 2→4, 3→5, 4→5, 5→6, 5→7; node 4
/// only on the second device.
fn openvino_example() -> (
    tessera_common::graph::Graph,
    tessera_common::affinity::Assignment,
) {
    let names = ["1", "2", "3", "4", "5", "6", "7"];
    let edges = [(0, 1), (1, 2), (1, 3), (2, 4), (3, 4), (4, 5), (4, 6)];
    let g = graph_from(7, &edges, Some(&names));
    let first = SupportSet::from_nodes(["1", "2", "3", "5", "6", "7"]);
    let a = assign_priority(
        &g,
        "HETERO:GPU,CPU",
        vec![("GPU", first), ("CPU", SupportSet::from_nodes(["4"]))],
    );
    (g, a)
}

#[test]
fn openvino_example_reference_gives_openvino_result() {
    let (g, a) = openvino_example();
    for merge in [false, true] {
        let p = run(&g, &a, Algorithm::Reference, merge);
        assert_eq!(
            groups(&g, &p),
            set(&[
                ("GPU", &["3", "5", "6", "7"]),
                ("GPU", &["1", "2"]),
                ("CPU", &["4"])
            ]),
            "merge={merge}"
        );
    }
}

#[test]
fn openvino_example_reference_trace_matches_the_document() {
    let (g, a) = openvino_example();
    let dag = op_dag(&g, &a).unwrap();
    let (_, trace) = select_traced(&dag);
    use Step::*;
    // Node k of the example is index k-1.
    let first_round = vec![
        Root(0),
        Merge(1),
        Merge(2),
        Merge(4),
        Merge(5),
        Merge(6),
        Reject(3),
        Rollback(6),
        Rollback(5),
        Rollback(4),
        Root(4),
        Merge(5),
        Merge(6),
        Merge(2),
        Merge(1),
        Reject(3),
        Rollback(1),
    ];
    assert_eq!(&trace[..first_round.len()], &first_round[..]);
}

#[test]
fn openvino_example_fast_is_valid_with_as_few_subgraphs() {
    let (g, a) = openvino_example();
    let p = run(&g, &a, Algorithm::Fast, true);
    assert_eq!(p.subgraphs.len(), 3);
    assert_eq!(
        groups(&g, &p),
        set(&[
            ("GPU", &["1", "2", "3"]),
            ("GPU", &["5", "6", "7"]),
            ("CPU", &["4"])
        ])
    );
}

/// TVM's partitioning RFC example: A, B, D on one backend, C on another; A→B, B→C,
/// C→D, B→D. [A,B,D]+[C] would be uncomputable.
#[test]
fn tvm_rfc_example() {
    let names = ["A", "B", "C", "D"];
    let g = graph_from(4, &[(0, 1), (1, 2), (2, 3), (1, 3)], Some(&names));
    let a = assign_priority(
        &g,
        "HETERO:NPU,CPU",
        vec![
            ("NPU", SupportSet::from_nodes(["A", "B", "D"])),
            ("CPU", SupportSet::all()),
        ],
    );
    for algorithm in [Algorithm::Fast, Algorithm::Reference] {
        for merge in [false, true] {
            let p = run(&g, &a, algorithm, merge);
            assert_eq!(
                groups(&g, &p),
                set(&[("NPU", &["A", "B"]), ("CPU", &["C"]), ("NPU", &["D"])]),
                "{algorithm:?} merge={merge}"
            );
            // Ids are a topological order: [A,B] first, then C, then D.
            let names: Vec<&str> = p
                .subgraphs
                .iter()
                .map(|s| g.node(s.nodes[0]).name.as_str())
                .collect();
            assert_eq!(names, ["A", "C", "D"]);
        }
    }
}

/// A(d1) → B(d2) → C(d1) → D(d2) → E(d1), skip edges A→E and B→D: every
/// merge would close a multi-hop cycle.
#[test]
fn multi_hop_cycles_are_never_closed() {
    let names = ["A", "B", "C", "D", "E"];
    let g = graph_from(
        5,
        &[(0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (1, 3)],
        Some(&names),
    );
    let a = assign_priority(
        &g,
        "HETERO:GPU,CPU",
        vec![
            ("GPU", SupportSet::from_nodes(["A", "C", "E"])),
            ("CPU", SupportSet::all()),
        ],
    );
    for algorithm in [Algorithm::Fast, Algorithm::Reference] {
        let p = run(&g, &a, algorithm, true);
        assert_eq!(
            groups(&g, &p),
            set(&[
                ("GPU", &["A"]),
                ("CPU", &["B"]),
                ("GPU", &["C"]),
                ("CPU", &["D"]),
                ("GPU", &["E"])
            ]),
            "{algorithm:?}"
        );
    }
}

/// Independent branches joining later: the merge pass must unite what the
/// greedy left apart when no path runs between them.
#[test]
fn merge_pass_unites_adjacent_same_device_subgraphs() {
    // X(CPU) feeds B(GPU); A(GPU) → B. Topological order A, X, B.
    let names = ["A", "X", "B"];
    let g = graph_from(3, &[(0, 2), (1, 2)], Some(&names));
    let a = assign_priority(
        &g,
        "HETERO:GPU,CPU",
        vec![
            ("GPU", SupportSet::from_nodes(["A", "B"])),
            ("CPU", SupportSet::all()),
        ],
    );
    for algorithm in [Algorithm::Fast, Algorithm::Reference] {
        let p = run(&g, &a, algorithm, true);
        assert_eq!(
            groups(&g, &p),
            set(&[("GPU", &["A", "B"]), ("CPU", &["X"])]),
            "{algorithm:?}"
        );
    }
}
