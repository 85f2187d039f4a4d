//! `reference` subgraph selection: OpenVINO HETERO's algorithm,
//! faithfully.
//!
//! Repeat until every node is placed: for each device, for each possible root
//! (a node of that device not yet in a subgraph built this round), grow a
//! subgraph from the root: take the next node adjacent to the subgraph (depth
//! first from the most recently added node, successors before predecessors)
//! that is not rejected; add it if it has the same device, else reject it;
//! then check the global condition (no indirect self-reference: no rejected
//! node lies on a path between two nodes of the subgraph) and, while it
//! fails, roll back the most recently added node into the rejected list.
//! Of all subgraphs built in a round the largest is kept (the first on ties)
//! and the rest are rebuilt next round from the remaining nodes.
//!
//! The self-reference check uses the transitive closure as bitsets: a
//! rejected node `r` lies on a path between two subgraph nodes exactly when
//! `r` is both a descendant and an ancestor of the subgraph, which is the
//! seed's pairwise "path nodes ∩ rejected" test computed for all pairs at
//! once. Nodes already committed to subgraphs count as rejected.
//!
//! One correction to the seed: per-subgraph convexity is not enough. With
//! `a→b`, `c→d`, subgraphs `{a,d}` and `{b,c}` are each free of
//! self-references yet depend on each other. So once a subgraph is
//! committed, the closure treats it as one unit (reaching any of its nodes
//! reaches everything reachable from any of them), and later subgraphs are
//! checked against paths through committed subgraphs too. On the seed's
//! example this changes nothing. Memory is quadratic in the node count, as
//! in OpenVINO: use it on small graphs or as a yardstick.

use super::dag::OpDag;

#[derive(Clone)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(n: usize) -> Bits {
        Bits(vec![0; n.div_ceil(64)])
    }
    fn get(&self, i: u32) -> bool {
        self.0[i as usize / 64] >> (i % 64) & 1 == 1
    }
    fn set(&mut self, i: u32) {
        self.0[i as usize / 64] |= 1 << (i % 64);
    }
    fn clear(&mut self, i: u32) {
        self.0[i as usize / 64] &= !(1 << (i % 64));
    }
    fn or(&mut self, other: &Bits) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a |= b;
        }
    }
    /// `self & a & b` is non-empty.
    fn meets(&self, a: &Bits, b: &Bits) -> bool {
        self.0
            .iter()
            .zip(&a.0)
            .zip(&b.0)
            .any(|((x, y), z)| x & y & z != 0)
    }
}

/// One trace step of a growth, for tests and debugging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Root(u32),
    Merge(u32),
    Reject(u32),
    Rollback(u32),
}

struct Closure {
    desc: Vec<Bits>,
    anc: Vec<Bits>,
}

impl Closure {
    fn new(dag: &OpDag) -> Closure {
        let n = dag.len();
        let mut desc = vec![Bits::new(n); n];
        for v in (0..n as u32).rev() {
            for &s in dag.succs(v) {
                let (lo, hi) = desc.split_at_mut(s as usize);
                lo[v as usize].or(&hi[0]);
                lo[v as usize].set(s);
            }
        }
        let mut anc = vec![Bits::new(n); n];
        for v in 0..n as u32 {
            for &p in dag.preds(v) {
                let (lo, hi) = anc.split_at_mut(v as usize);
                hi[0].or(&lo[p as usize]);
                hi[0].set(p);
            }
        }
        Closure { desc, anc }
    }

    /// Makes `members` one unit: whoever reaches one of them reaches all
    /// that any of them reaches, and symmetrically for ancestors.
    fn commit(&mut self, members: &[u32]) {
        let n = self.desc.len();
        let mut unit = Bits::new(n);
        for &m in members {
            unit.set(m);
        }
        for closure in [&mut self.desc, &mut self.anc] {
            let mut reach = unit.clone();
            for &m in members {
                reach.or(&closure[m as usize]);
            }
            for (v, bits) in closure.iter_mut().enumerate() {
                if unit.get(v as u32) || bits.0.iter().zip(&unit.0).any(|(a, b)| a & b != 0) {
                    bits.or(&reach);
                }
            }
        }
    }
}

/// Grows one subgraph from `root`. `blocked` holds nodes that can never be
/// added (committed to earlier subgraphs); they count as rejected for the
/// self-reference check.
fn grow(dag: &OpDag, cl: &Closure, root: u32, blocked: &Bits, trace: &mut Vec<Step>) -> Vec<u32> {
    let n = dag.len();
    let dev = dag.device[root as usize];
    let mut members = vec![root];
    let mut in_sg = Bits::new(n);
    in_sg.set(root);
    let mut rejected = blocked.clone();
    let mut desc = cl.desc[root as usize].clone();
    let mut anc = cl.anc[root as usize].clone();
    trace.push(Step::Root(root));
    loop {
        let next = members.iter().rev().find_map(|&m| {
            dag.succs(m)
                .iter()
                .chain(dag.preds(m))
                .copied()
                .find(|&x| !in_sg.get(x) && !rejected.get(x))
        });
        let Some(x) = next else { break };
        if dag.device[x as usize] == dev {
            members.push(x);
            in_sg.set(x);
            desc.or(&cl.desc[x as usize]);
            anc.or(&cl.anc[x as usize]);
            trace.push(Step::Merge(x));
        } else {
            rejected.set(x);
            trace.push(Step::Reject(x));
        }
        while rejected.meets(&desc, &anc) {
            let Some(last) = members.pop() else { break };
            in_sg.clear(last);
            rejected.set(last);
            trace.push(Step::Rollback(last));
            desc = Bits::new(n);
            anc = Bits::new(n);
            for &m in &members {
                desc.or(&cl.desc[m as usize]);
                anc.or(&cl.anc[m as usize]);
            }
        }
    }
    members.sort_unstable();
    members
}

/// Returns a subgraph label per node, and the trace of every growth.
pub fn select_traced(dag: &OpDag) -> (Vec<u32>, Vec<Step>) {
    let n = dag.len();
    let mut cl = Closure::new(dag);
    let mut label = vec![u32::MAX; n];
    let mut committed = Bits::new(n);
    let mut remaining = n;
    let mut next_label = 0u32;
    let mut trace = Vec::new();
    while remaining > 0 {
        let mut best: Option<Vec<u32>> = None;
        for dev in 0..dag.device_count() as u16 {
            let mut used = Bits::new(n);
            for root in 0..n as u32 {
                if committed.get(root) || used.get(root) || dag.device[root as usize] != dev {
                    continue;
                }
                let sg = grow(dag, &cl, root, &committed, &mut trace);
                for &m in &sg {
                    used.set(m);
                }
                if best.as_ref().is_none_or(|b| sg.len() > b.len()) {
                    best = Some(sg);
                }
            }
        }
        let Some(best) = best else { break };
        for &m in &best {
            label[m as usize] = next_label;
            committed.set(m);
        }
        cl.commit(&best);
        remaining -= best.len();
        next_label += 1;
    }
    (label, trace)
}

/// Returns a subgraph label per node.
pub fn select(dag: &OpDag) -> Vec<u32> {
    select_traced(dag).0
}
