//! Placement that fits: a model too big for the devices the policy chose
//! is cut into contiguous stages along a topological order, one device
//! each, so that every stage fits its device's memory and the slowest
//! stage is as fast as it can be (each stage's predicted compute on its
//! own device, by that device's measured speed, plus moving its inputs).
//! Stages along one topological order are acyclic by construction.
//!
//! How:
//! 1. The op nodes are laid out in topological order; nodes computed from
//!    constants alone travel with their first reader, and no cut falls
//!    inside a group of nodes that must share a device (sequences, state),
//!    nor inside a layer the model declares (a decoder's stages hold whole
//!    layers).
//! 2. For a given bound `T` on a stage's time, devices in a given order
//!    each take the longest run of nodes that fits their memory, that they
//!    run, and whose time stays within `T` (`Line::extend`); `T` is
//!    bisected to the least that covers the whole model. Three device
//!    orders are tried (priority, most memory first, fastest first) and the
//!    best kept: a host twice as fast takes about twice the work where its
//!    memory allows.
//! 3. With a little slack on that bound, each cut moves to the position
//!    within reach where the fewest bytes cross (the tiebreak).
//!
//! Memory per stage is estimated conservatively here (activations alive
//! anywhere at a position count for the stage holding it); the plan is
//! checked exactly once its subgraphs are made.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{format_size, MemoryNeed, NeedModel};
use crate::affinity::{collections::one_device_groups, CostModel, DeviceId, SupportSet};
use crate::graph::{Graph, NodeId, NodeKind};

/// Slack on the best bound within which cuts move to cheaper positions.
const SLACK: f64 = 0.02;

/// What the placement needs.
pub struct FitRequest<'a> {
    pub need: &'a NeedModel<'a>,
    /// Candidate devices, in priority order.
    pub devices: &'a [DeviceId],
    pub supports: &'a HashMap<DeviceId, SupportSet>,
    /// Bytes each device may use; a device not listed has no limit.
    pub budgets: &'a HashMap<DeviceId, u64>,
    pub cost: &'a dyn CostModel,
}

/// One stage of a pipeline.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PipelineStage {
    pub device: String,
    /// Its first and last node in topological order, and how many.
    pub first: String,
    pub last: String,
    pub nodes: usize,
    /// Predicted compute per request on its device, µs.
    pub compute_us: f64,
    /// Bytes entering it from earlier stages per request.
    pub transfer_in: u64,
    /// Predicted time per request: compute plus moving its inputs, µs.
    pub time_us: f64,
    /// Estimated need (see the module doc).
    pub need: MemoryNeed,
    /// What its device offers (`None`: no limit).
    pub budget: Option<u64>,
}

/// Stages that fit.
#[derive(Debug, Clone)]
pub struct Pipeline {
    pub stages: Vec<PipelineStage>,
    /// The slowest stage's predicted time per request, µs.
    pub bottleneck_us: f64,
    /// The device of each node the stages cover (nodes computed from
    /// constants alone are left to follow their readers).
    pub placement: BTreeMap<NodeId, DeviceId>,
}

/// Why no placement fits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the model does not fit the devices' memory: it needs {} in all, the devices offer {} ({}); \
     its largest single need is {} (node '{}'){}",
    .need,
    .offered.map_or("no limit".to_string(), format_size),
    .offered_by,
    format_size(*.largest),
    .largest_node,
    .why
)]
pub struct FitError {
    pub need: MemoryNeed,
    /// Sum of the devices' limits (`None`: one has none).
    pub offered: Option<u64>,
    /// Each device and what it offers.
    pub offered_by: String,
    /// The largest need of a single node (its weights, activations, state).
    pub largest: u64,
    pub largest_node: String,
    /// What else stands in the way, if anything.
    pub why: String,
}

/// Cuts the model into stages that fit (see the module doc).
pub fn pipeline(req: &FitRequest) -> Result<Pipeline, FitError> {
    let line = Line::new(req);
    let mut best: Option<(f64, Vec<usize>)> = None;
    for order in line.device_orders() {
        let Some(at_most) = line
            .fill(&order, f64::INFINITY)
            .map(|s| line.bottleneck(&s))
        else {
            continue;
        };
        let t = line.least_bound(&order, at_most);
        if best.as_ref().is_none_or(|(b, _)| t < *b) {
            best = Some((t, order));
        }
    }
    let Some((t, order)) = best else {
        return Err(line.why_not());
    };
    let bound = t * (1.0 + SLACK);
    let stages = line
        .refined(&order, bound)
        .filter(|s| line.bottleneck(s) <= bound)
        .or_else(|| line.fill(&order, t))
        .ok_or_else(|| line.why_not())?;
    Ok(line.pipeline(&stages))
}

/// `placement` (every node the stages cover → its device) as a pipeline,
/// if it still is one: contiguous stages, one device each, that fit their
/// devices' memory and that their devices run. A re-plan keeps such a
/// placement when it predicts nearly as well as a new one: moving a stage
/// means shipping its weights again.
pub fn keep(req: &FitRequest, placement: &BTreeMap<NodeId, DeviceId>) -> Option<Pipeline> {
    let line = Line::new(req);
    let index: HashMap<&DeviceId, usize> = req
        .devices
        .iter()
        .enumerate()
        .map(|(k, d)| (d, k))
        .collect();
    let mut spans: Vec<Span> = Vec::new();
    for (i, id) in line.order.iter().enumerate() {
        let k = *index.get(placement.get(id)?)?;
        match spans.last_mut() {
            Some(last) if last.0 == k => last.2 = i + 1,
            _ => {
                if spans.iter().any(|s| s.0 == k) || (i > 0 && !line.cut_ok[i]) {
                    return None;
                }
                spans.push((k, i, i + 1));
            }
        }
    }
    let fits = spans.iter().all(|&(k, start, end)| {
        let mut acc = Acc::default();
        (start..end).all(|i| line.runs[k][i] && acc.add(&line, i, k))
    });
    (fits && !spans.is_empty()).then(|| line.pipeline(&spans))
}

/// A stage while planning: device index, and positions `start..end`.
type Span = (usize, usize, usize);

/// The model laid out in one topological order, with what each position
/// costs on each device.
struct Line<'a> {
    req: &'a FitRequest<'a>,
    graph: &'a Graph,
    order: Vec<NodeId>,
    /// Per position: nodes computed from constants alone that travel with it.
    attached: Vec<Vec<NodeId>>,
    /// Per position: the weights read there (Constant nodes, and what
    /// attached nodes make), bytes.
    weights: Vec<Vec<(NodeId, u64)>>,
    /// Per position: activation bytes alive while it runs.
    live: Vec<u64>,
    state: Vec<u64>,
    /// `crossing[c]`: bytes made before position `c` and read at or after it.
    crossing: Vec<u64>,
    /// `cut_ok[c]`: a stage may start at `c`.
    cut_ok: Vec<bool>,
    /// Per device: compute per position, µs, and support.
    compute: Vec<Vec<f64>>,
    runs: Vec<Vec<bool>>,
    budgets: Vec<u64>,
}

/// The op nodes in topological order but those computed from constants
/// alone, which are attached to their earliest reader's position; every
/// op node's position.
struct Layout {
    order: Vec<NodeId>,
    position: HashMap<NodeId, usize>,
    attached: Vec<Vec<NodeId>>,
    constant_fed: Vec<bool>,
}

fn layout(graph: &Graph) -> Layout {
    let constant_fed = constant_fed(graph);
    let order: Vec<NodeId> = graph
        .topo_ops()
        .iter()
        .copied()
        .filter(|&id| !constant_fed[id.index()])
        .collect();
    let n = order.len();
    let mut position: HashMap<NodeId, usize> =
        order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    // Readers first: reverse topological order.
    let mut attached = vec![Vec::new(); n];
    for &id in graph.topo_ops().iter().rev() {
        if !constant_fed[id.index()] {
            continue;
        }
        let target = readers(graph, id)
            .filter_map(|r| position.get(&r).copied())
            .min()
            .unwrap_or(0)
            .min(n.saturating_sub(1));
        position.insert(id, target);
        if n > 0 {
            attached[target].push(id);
        }
    }
    Layout {
        order,
        position,
        attached,
        constant_fed,
    }
}

/// Per position: the weights read there (with what attached nodes make),
/// and the declared state.
fn weights_and_state(need: &NeedModel, layout: &Layout) -> (Vec<Vec<(NodeId, u64)>>, Vec<u64>) {
    let graph = need.graph();
    let n = layout.order.len();
    let mut weights = vec![Vec::new(); n];
    let mut state = vec![0u64; n];
    for (i, &id) in layout.order.iter().enumerate() {
        weights[i].extend(need.weights_read(id));
        state[i] += need.state_of(id);
        for &a in &layout.attached[i] {
            weights[i].extend(need.weights_read(a));
            let made: u64 = graph
                .node(a)
                .outputs
                .iter()
                .flatten()
                .map(|&t| need.tensor_bytes(t))
                .sum();
            weights[i].push((a, made));
            state[i] += need.state_of(a);
        }
    }
    (weights, state)
}

/// `cut_ok[c]`: no group of nodes that must share a device (nor a layer
/// the model declares) spans cut `c`.
fn allowed_cuts(graph: &Graph, layout: &Layout) -> Vec<bool> {
    let mut cut_ok = vec![true; layout.order.len() + 1];
    for group in one_device_groups(graph).into_iter().chain(graph.layers()) {
        let at: Vec<usize> = group
            .iter()
            .filter_map(|g| layout.position.get(g).copied())
            .collect();
        if let (Some(&lo), Some(&hi)) = (at.iter().min(), at.iter().max()) {
            cut_ok[lo + 1..=hi].iter_mut().for_each(|c| *c = false);
        }
    }
    cut_ok
}

impl<'a> Line<'a> {
    fn new(req: &'a FitRequest<'a>) -> Line<'a> {
        let graph = req.need.graph();
        let layout = layout(graph);
        let (weights, state) = weights_and_state(req.need, &layout);
        let (live, crossing) = liveness(req.need, &layout);
        let cut_ok = allowed_cuts(graph, &layout);
        let Layout {
            order, attached, ..
        } = layout;
        let compute = req
            .devices
            .iter()
            .map(|d| {
                (0..order.len())
                    .map(|i| {
                        std::iter::once(order[i])
                            .chain(attached[i].iter().copied())
                            .map(|id| req.cost.compute_us(graph, id, d))
                            .sum()
                    })
                    .collect()
            })
            .collect();
        let runs = req
            .devices
            .iter()
            .map(|d| {
                let support = req.supports.get(d);
                order
                    .iter()
                    .map(|&id| support.is_some_and(|s| s.contains(graph.node(id))))
                    .collect()
            })
            .collect();
        let budgets = req
            .devices
            .iter()
            .map(|d| req.budgets.get(d).copied().unwrap_or(u64::MAX))
            .collect();
        Line {
            req,
            graph,
            order,
            attached,
            weights,
            live,
            state,
            crossing,
            cut_ok,
            compute,
            runs,
            budgets,
        }
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    /// Time to move `bytes` into a stage on device `k`, µs.
    fn transfer_us(&self, bytes: u64, k: usize) -> f64 {
        if bytes == 0 {
            return 0.0;
        }
        let to = &self.req.devices[k];
        let from = DeviceId {
            host: Some(format!("{}~peer", to.host.as_deref().unwrap_or(""))),
            ..to.clone()
        };
        self.req.cost.transfer_us(bytes, &from, to)
    }

    /// The orders devices are filled in: priority, most memory first,
    /// fastest first (each once).
    fn device_orders(&self) -> Vec<Vec<usize>> {
        let m = self.req.devices.len();
        let priority: Vec<usize> = (0..m).collect();
        let mut by_memory = priority.clone();
        by_memory.sort_by_key(|&k| std::cmp::Reverse(self.budgets[k]));
        let total = |k: usize| self.compute[k].iter().sum::<f64>();
        let mut by_speed = priority.clone();
        by_speed.sort_by(|&a, &b| total(a).total_cmp(&total(b)));
        let mut orders = vec![priority];
        for o in [by_memory, by_speed] {
            if !orders.contains(&o) {
                orders.push(o);
            }
        }
        orders
    }

    /// The latest end of a stage on device `k` starting at `start` within
    /// time `t` (`None`: not even one node fits).
    fn extend(&self, k: usize, start: usize, t: f64) -> Option<usize> {
        let n = self.len();
        let transfer = if start == 0 {
            0.0
        } else {
            self.transfer_us(self.crossing[start], k)
        };
        let mut acc = Acc::default();
        let mut best = None;
        for i in start..n {
            if !self.runs[k][i] || !acc.add(self, i, k) || acc.compute + transfer > t {
                break;
            }
            if i + 1 == n || self.cut_ok[i + 1] {
                best = Some(i + 1);
            }
        }
        best
    }

    /// Devices in `order` each take the longest run within `t`; the stages,
    /// if they cover the model.
    fn fill(&self, order: &[usize], t: f64) -> Option<Vec<Span>> {
        let mut stages = Vec::new();
        let mut pos = 0;
        for &k in order {
            if pos == self.len() {
                break;
            }
            if let Some(end) = self.extend(k, pos, t) {
                stages.push((k, pos, end));
                pos = end;
            }
        }
        (pos == self.len()).then_some(stages)
    }

    /// The least bound on a stage's time that `fill` covers the model with
    /// in `order`, given that `at_most` does.
    fn least_bound(&self, order: &[usize], at_most: f64) -> f64 {
        let (mut lo, mut hi) = (0.0, at_most);
        for _ in 0..60 {
            if hi - lo <= hi * 1e-4 {
                break;
            }
            let mid = (lo + hi) / 2.0;
            if self.fill(order, mid).is_some() {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }

    /// `suffix[j]`: the earliest position from which devices `order[j..]`
    /// cover the rest of the model within `t` (each taking the longest run
    /// backwards).
    fn suffix_starts(&self, order: &[usize], t: f64) -> Vec<usize> {
        let m = order.len();
        let mut suffix = vec![self.len(); m + 1];
        for j in (0..m).rev() {
            let (k, end) = (order[j], suffix[j + 1]);
            let mut acc = Acc::default();
            let mut best = end;
            for s in (0..end).rev() {
                if !self.runs[k][s] || !acc.add(self, s, k) || acc.compute > t {
                    break;
                }
                let transfer = if s == 0 {
                    0.0
                } else {
                    self.transfer_us(self.crossing[s], k)
                };
                if self.cut_ok[s] && acc.compute + transfer <= t {
                    best = s;
                }
            }
            suffix[j] = best;
        }
        suffix
    }

    /// `fill` within `t`, each cut moved to where the fewest bytes cross
    /// among the positions that keep the rest coverable.
    fn refined(&self, order: &[usize], t: f64) -> Option<Vec<Span>> {
        let suffix = self.suffix_starts(order, t);
        let mut stages = Vec::new();
        let mut pos = 0;
        for (j, &k) in order.iter().enumerate() {
            if pos == self.len() {
                break;
            }
            let Some(latest) = self.extend(k, pos, t) else {
                continue;
            };
            let earliest = suffix[j + 1].max(pos + 1);
            let crossing = |e: usize| if e == self.len() { 0 } else { self.crossing[e] };
            // The fewest bytes; among equals the latest (the even split).
            let end = (earliest..=latest)
                .filter(|&e| e == self.len() || self.cut_ok[e])
                .min_by_key(|&e| (crossing(e), std::cmp::Reverse(e)))
                .unwrap_or(latest);
            stages.push((k, pos, end));
            pos = end;
        }
        (pos == self.len()).then_some(stages)
    }

    fn stage_time(&self, &(k, start, end): &Span) -> f64 {
        let transfer = if start == 0 {
            0.0
        } else {
            self.transfer_us(self.crossing[start], k)
        };
        self.compute[k][start..end].iter().sum::<f64>() + transfer
    }

    fn bottleneck(&self, stages: &[Span]) -> f64 {
        stages
            .iter()
            .map(|s| self.stage_time(s))
            .fold(0.0, f64::max)
    }

    fn pipeline(&self, stages: &[Span]) -> Pipeline {
        let mut placement = BTreeMap::new();
        let reports = stages
            .iter()
            .map(|span @ &(k, start, end)| {
                let device = &self.req.devices[k];
                let mut acc = Acc::default();
                for i in start..end {
                    acc.add(self, i, k);
                    placement.insert(self.order[i], device.clone());
                }
                PipelineStage {
                    device: device.to_string(),
                    first: self.graph.node(self.order[start]).name.clone(),
                    last: self.graph.node(self.order[end - 1]).name.clone(),
                    nodes: (start..end).map(|i| 1 + self.attached[i].len()).sum(),
                    compute_us: self.compute[k][start..end].iter().sum(),
                    transfer_in: if start == 0 { 0 } else { self.crossing[start] },
                    need: acc.need(),
                    budget: (self.budgets[k] != u64::MAX).then_some(self.budgets[k]),
                    time_us: self.stage_time(span),
                }
            })
            .collect();
        Pipeline {
            stages: reports,
            bottleneck_us: self.bottleneck(stages),
            placement,
        }
    }

    /// The error when nothing fits: the totals and the largest single need.
    fn why_not(&self) -> FitError {
        let mut all = Acc::default();
        let mut largest = (0u64, String::new(), 0usize);
        for i in 0..self.len() {
            all.add_unchecked(self, i);
            let mut one = Acc::default();
            one.add_unchecked(self, i);
            let single = one.need().total();
            if single > largest.0 {
                largest = (single, self.graph.node(self.order[i]).name.clone(), i);
            }
        }
        let devices = self.req.devices;
        let offered = self
            .budgets
            .iter()
            .try_fold(0u64, |s, &b| (b != u64::MAX).then(|| s.saturating_add(b)));
        let offered_by = devices
            .iter()
            .zip(&self.budgets)
            .map(|(d, &b)| {
                let b = if b == u64::MAX {
                    "no limit".into()
                } else {
                    format_size(b)
                };
                format!("{d} {b}")
            })
            .collect::<Vec<_>>()
            .join(", ");
        let need = all.need();
        let runs_largest =
            (0..devices.len()).filter(|&k| self.runs[k].get(largest.2) == Some(&true));
        let most = runs_largest.map(|k| (self.budgets[k], k)).max();
        let why = match most {
            None if self.len() > 0 => ", and no device runs that node".to_string(),
            Some((b, k)) if b < largest.0 => format!(
                ", more than any device that runs it offers (the most: {} on {})",
                format_size(b),
                devices[k]
            ),
            _ if offered.is_some_and(|o| o < need.total()) => String::new(),
            _ => ": the devices offer enough in all, but no cut into contiguous stages fits \
                  each device (nodes that must share a device, or nodes only some devices run)"
                .to_string(),
        };
        FitError {
            need,
            offered,
            offered_by,
            largest: largest.0,
            largest_node: largest.1,
            why,
        }
    }
}

/// A stage's running totals while it grows.
#[derive(Default)]
struct Acc {
    seen: HashSet<NodeId>,
    weights: u64,
    live: u64,
    state: u64,
    compute: f64,
}

impl Acc {
    /// Adds position `i` on device `k`; false when the stage no longer
    /// fits the device's memory.
    fn add(&mut self, line: &Line, i: usize, k: usize) -> bool {
        self.add_unchecked(line, i);
        self.compute += line.compute[k][i];
        self.need().total() <= line.budgets[k]
    }

    fn add_unchecked(&mut self, line: &Line, i: usize) {
        for &(w, bytes) in &line.weights[i] {
            if self.seen.insert(w) {
                self.weights = self.weights.saturating_add(bytes);
            }
        }
        self.live = self.live.max(line.live[i]);
        self.state = self.state.saturating_add(line.state[i]);
    }

    fn need(&self) -> MemoryNeed {
        MemoryNeed {
            weights: self.weights,
            activations: self.live,
            state: self.state,
        }
    }
}

/// Op nodes computed from constants alone (every input a constant or made
/// from constants alone), by node index.
fn constant_fed(graph: &Graph) -> Vec<bool> {
    let mut fed = vec![false; graph.dag.node_count()];
    for &id in graph.topo_ops() {
        let node = graph.node(id);
        fed[id.index()] = node.all_inputs().next().is_some()
            && node.all_inputs().all(|t| {
                let p = graph.tensor(t).producer;
                graph.node(p).kind == NodeKind::Constant || fed[p.index()]
            });
    }
    fed
}

/// The op nodes that read `id`'s outputs.
fn readers(graph: &Graph, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
    graph
        .node(id)
        .outputs
        .iter()
        .flatten()
        .flat_map(move |&t| graph.tensor(t).consumers.iter().copied())
        .filter(move |&c| graph.node(c).kind == NodeKind::Op)
}

/// Activation bytes alive at each position, and the bytes crossing each
/// cut. A tensor lives from its maker's position (0 for a graph input) to
/// its last reader's; weights and what attached nodes make are weights.
fn liveness(need: &NeedModel, layout: &Layout) -> (Vec<u64>, Vec<u64>) {
    let graph = need.graph();
    let (position, constant_fed) = (&layout.position, &layout.constant_fed);
    let n = layout.order.len();
    let mut live_delta = vec![0i128; n + 1];
    let mut cross_delta = vec![0i128; n + 2];
    for (t, tensor) in graph.tensors.iter().enumerate() {
        let producer = graph.node(tensor.producer);
        let start = match producer.kind {
            NodeKind::Parameter => 0,
            NodeKind::Op if !constant_fed[tensor.producer.index()] => {
                match position.get(&tensor.producer) {
                    Some(&p) => p,
                    None => continue,
                }
            }
            _ => continue,
        };
        let end = tensor
            .consumers
            .iter()
            .filter_map(|c| position.get(c).copied())
            .max()
            .unwrap_or(start)
            .max(start);
        let bytes = i128::from(need.tensor_bytes(crate::graph::TensorId(t as u32)));
        live_delta[start] += bytes;
        live_delta[end + 1] -= bytes;
        // It crosses the cuts start+1 ..= end.
        cross_delta[start + 1] += bytes;
        cross_delta[end + 1] -= bytes;
    }
    let running = |delta: &[i128], len: usize| -> Vec<u64> {
        let mut acc = 0i128;
        delta[..len]
            .iter()
            .map(|d| {
                acc += d;
                u64::try_from(acc.max(0)).unwrap_or(u64::MAX)
            })
            .collect()
    };
    (running(&live_delta, n), running(&cross_delta, n + 1))
}
