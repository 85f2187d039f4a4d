//! Sequences and optionals stay inside one subgraph: they cannot cross a
//! device boundary (see [`Graph::collections`]). So does a state pair's
//! state: the nodes that read its past input and the one that makes its
//! present output run where the state is kept. The nodes joined by such
//! values form a group that runs on one device: a device placed by hand
//! if one is, else the device of the group's first maker, else the first
//! device in priority order that runs the whole group. The group includes
//! every node on a path between two of its nodes: were one of those on
//! another device, the subgraph selection would have to cut the group in
//! two to stay acyclic.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use super::{AffinityError, AffinityRequest, DeviceIdx, Explanation, Rule, SupportSet};
use crate::graph::{Graph, NodeId, NodeKind};

/// Union-find over node indexes.
struct Groups(Vec<usize>);

impl Groups {
    fn root(&mut self, mut i: usize) -> usize {
        while self.0[i] != i {
            self.0[i] = self.0[self.0[i]];
            i = self.0[i];
        }
        i
    }

    fn join(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.root(a), self.root(b));
        self.0[rb] = ra;
    }
}

/// Op nodes joined by sequences, optionals or state pairs, with the nodes on paths
/// between them, each group in topological order, with one value that
/// joins it (for messages). Groups whose paths meet are one group.
fn groups(graph: &Graph) -> Vec<(Vec<NodeId>, String)> {
    let collections = graph.collections();
    let mut g = Groups((0..graph.dag.node_count()).collect());
    let mut value: HashMap<usize, String> = HashMap::new();
    for &t in &collections {
        let tensor = graph.tensor(t);
        for &reader in &tensor.consumers {
            if graph.node(reader).kind == NodeKind::Op {
                g.join(tensor.producer.index(), reader.index());
                value.insert(tensor.producer.index(), tensor.name.clone());
            }
        }
    }
    for pair in graph.state_pairs().unwrap_or_default() {
        let (Some(past), Some(present)) = (
            graph.tensor_by_name(&pair.past),
            graph.tensor_by_name(&pair.present),
        ) else {
            continue;
        };
        let producer = graph.tensor(present).producer;
        if graph.node(producer).kind != NodeKind::Op {
            continue;
        }
        for &reader in &graph.tensor(past).consumers {
            if graph.node(reader).kind == NodeKind::Op {
                g.join(producer.index(), reader.index());
                value.insert(producer.index(), pair.present.clone());
            }
        }
    }
    loop {
        let mut by_root: BTreeMap<usize, Vec<NodeId>> = BTreeMap::new();
        for &id in graph.topo_ops() {
            let root = g.root(id.index());
            by_root.entry(root).or_default().push(id);
        }
        let closed: Vec<Vec<NodeId>> = by_root
            .into_values()
            .filter(|members| members.len() > 1)
            .map(|members| with_paths_between(graph, members))
            .collect();
        let mut grew = false;
        for members in &closed {
            for pair in members.windows(2) {
                if g.root(pair[0].index()) != g.root(pair[1].index()) {
                    g.join(pair[0].index(), pair[1].index());
                    grew = true;
                }
            }
        }
        if !grew {
            return closed
                .into_iter()
                .map(|members| {
                    let name = members
                        .iter()
                        .find_map(|m| value.get(&m.index()).cloned())
                        .unwrap_or_default();
                    (members, name)
                })
                .collect();
        }
    }
}

/// The groups of op nodes that must run on one device, each in
/// topological order (for placements that cut by position).
pub(crate) fn one_device_groups(graph: &Graph) -> Vec<Vec<NodeId>> {
    groups(graph)
        .into_iter()
        .map(|(members, _)| members)
        .collect()
}

/// The op nodes reached from `start` following edges forward (`forward`)
/// or backward.
fn reach(graph: &Graph, start: &[NodeId], forward: bool) -> HashSet<NodeId> {
    let mut seen: HashSet<NodeId> = start.iter().copied().collect();
    let mut queue: VecDeque<NodeId> = start.iter().copied().collect();
    while let Some(id) = queue.pop_front() {
        let node = graph.node(id);
        let next: Vec<NodeId> = if forward {
            node.outputs
                .iter()
                .flatten()
                .flat_map(|&t| graph.tensor(t).consumers.iter().copied())
                .collect()
        } else {
            node.all_inputs()
                .map(|t| graph.tensor(t).producer)
                .collect()
        };
        for n in next {
            if graph.node(n).kind == NodeKind::Op && seen.insert(n) {
                queue.push_back(n);
            }
        }
    }
    seen
}

/// `members` and every op node on a path between two of them (reached
/// from one and reaching another), in topological order.
fn with_paths_between(graph: &Graph, members: Vec<NodeId>) -> Vec<NodeId> {
    let after = reach(graph, &members, true);
    let before = reach(graph, &members, false);
    graph
        .topo_ops()
        .iter()
        .copied()
        .filter(|id| after.contains(id) && before.contains(id))
        .collect()
}

/// Places every group of nodes joined by sequences or optionals on one
/// device. A group placed by hand on two devices, or that no device runs
/// whole, is an error naming the value.
pub(super) fn keep_whole(
    graph: &Graph,
    req: &AffinityRequest<'_>,
    supports: &[&SupportSet],
    device_of: &mut [Option<DeviceIdx>],
    explanations: &mut [Explanation],
) -> Result<(), AffinityError> {
    let position: HashMap<NodeId, usize> = explanations
        .iter()
        .enumerate()
        .map(|(i, e)| (e.node, i))
        .collect();
    let index_of = |d: &crate::affinity::DeviceId| req.priority.position(d);
    for (members, value) in groups(graph) {
        let names = || {
            members
                .iter()
                .map(|&m| graph.node(m).name.clone())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let split = |why: String| AffinityError::SplitCollection {
            value: value.clone(),
            nodes: names(),
            why,
        };
        let mut manual = members
            .iter()
            .filter_map(|m| req.manual.get(m).and_then(index_of));
        let fixed = manual.next();
        if manual.any(|d| Some(d) != fixed) {
            return Err(split(
                "manual affinity puts them on different devices".into(),
            ));
        }
        let runs_all = |d: usize| members.iter().all(|&m| supports[d].contains(graph.node(m)));
        let first_maker = members.first().and_then(|m| device_of[m.index()]);
        let device = match fixed {
            Some(d) if runs_all(d) => d,
            Some(_) => {
                return Err(split(
                    "the device placed by hand cannot run them all".into(),
                ))
            }
            None => first_maker
                .map(|d| d as usize)
                .filter(|&d| runs_all(d))
                .or_else(|| (0..supports.len()).find(|&d| runs_all(d)))
                .ok_or_else(|| split("no device runs them all".into()))?,
        };
        for &m in &members {
            if device_of[m.index()] == Some(device as DeviceIdx) {
                continue;
            }
            device_of[m.index()] = Some(device as DeviceIdx);
            if let Some(&i) = position.get(&m) {
                explanations[i].device = device as DeviceIdx;
                explanations[i].rule = Rule::WithCollection;
            }
        }
    }
    Ok(())
}
