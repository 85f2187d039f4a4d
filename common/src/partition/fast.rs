//! `fast` subgraph selection: one pass over the nodes in topological order,
//! in the spirit of TVM's restriction map (its partitioning RFC), kept near-linear by
//! replacing restriction sets with *ranks*.
//!
//! Every subgraph has a rank and every edge between subgraphs goes from a
//! lower to a higher rank, so the subgraph graph stays acyclic. A node may
//! join a parent subgraph `S` of its own device exactly when no path leads
//! from `S` to another of its parent subgraphs (the restriction-map rule: a
//! path that has left `S` may not re-enter it). Ranks make that test cheap:
//! only subgraphs ranked below the other parent can lie on such a path, so
//! the search from `S` stops at that rank, and most tests end at once
//! (nothing has left `S` yet, or every other parent ranks below `S`). After
//! a join, `S` is re-ranked above the other parents and the subgraphs after
//! it are pushed up as needed. A node that can join no parent opens a new
//! subgraph. The RFC's A→B→C→D example (A,B,D on one device, C on another,
//! B→D) gives `[A,B]`, `[C]`, `[D]`.

use super::dag::OpDag;

struct Sg {
    rank: u32,
    size: u32,
    device: u16,
    /// Subgraphs this one feeds (may hold duplicates).
    succs: Vec<u32>,
}

struct State {
    sgs: Vec<Sg>,
    mark: Vec<u32>,
    epoch: u32,
    stack: Vec<u32>,
}

impl State {
    /// Whether a path leads from `from` to any subgraph in `targets`
    /// (all of which rank at most `bound`).
    fn reaches_any(&mut self, from: u32, targets: &[u32], bound: u32) -> bool {
        if self.sgs[from as usize].succs.is_empty() || self.sgs[from as usize].rank >= bound {
            return false;
        }
        self.epoch += 1;
        self.stack.clear();
        self.stack.push(from);
        while let Some(x) = self.stack.pop() {
            for i in 0..self.sgs[x as usize].succs.len() {
                let y = self.sgs[x as usize].succs[i];
                if targets.contains(&y) {
                    return true;
                }
                if self.mark[y as usize] != self.epoch && self.sgs[y as usize].rank < bound {
                    self.mark[y as usize] = self.epoch;
                    self.stack.push(y);
                }
            }
        }
        false
    }

    /// Raises `s` to at least `rank` and pushes its successors above it.
    fn raise(&mut self, s: u32, rank: u32) {
        if self.sgs[s as usize].rank >= rank {
            return;
        }
        self.sgs[s as usize].rank = rank;
        self.stack.clear();
        self.stack.push(s);
        while let Some(x) = self.stack.pop() {
            let r = self.sgs[x as usize].rank;
            for i in 0..self.sgs[x as usize].succs.len() {
                let y = self.sgs[x as usize].succs[i];
                if self.sgs[y as usize].rank <= r {
                    self.sgs[y as usize].rank = r + 1;
                    self.stack.push(y);
                }
            }
        }
    }

    fn add_edge(&mut self, from: u32, to: u32) {
        let succs = &mut self.sgs[from as usize].succs;
        if succs.last() != Some(&to) && !succs.contains(&to) {
            succs.push(to);
        }
    }
}

/// How a node decides whether it may join a parent subgraph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinRule {
    /// Exactly when no path leads back (searches the subgraph graph).
    Exact,
    /// Only when the ranks prove it at once (every other parent ranks lower,
    /// or nothing has left the subgraph yet): joins less, searches never.
    Rank,
}

/// Returns a subgraph label per node.
pub fn select(dag: &OpDag, rule: JoinRule) -> Vec<u32> {
    let n = dag.len();
    let mut label = vec![u32::MAX; n];
    let mut st = State {
        sgs: Vec::new(),
        mark: Vec::new(),
        epoch: 0,
        stack: Vec::new(),
    };
    let mut parents: Vec<u32> = Vec::with_capacity(8);
    let mut others: Vec<u32> = Vec::with_capacity(8);
    let mut candidates: Vec<u32> = Vec::with_capacity(8);
    for v in 0..n as u32 {
        let dev = dag.device[v as usize];
        parents.clear();
        for &p in dag.preds(v) {
            let l = label[p as usize];
            if !parents.contains(&l) {
                parents.push(l);
            }
        }
        // Candidates: same-device parents, largest first.
        let mut best: Option<u32> = None;
        candidates.clear();
        candidates.extend(
            parents
                .iter()
                .copied()
                .filter(|&l| st.sgs[l as usize].device == dev),
        );
        if candidates.len() > 1 {
            candidates.sort_by_key(|&l| std::cmp::Reverse(st.sgs[l as usize].size));
        }
        for &s in &candidates {
            others.clear();
            others.extend(parents.iter().copied().filter(|&l| l != s));
            let bound = others
                .iter()
                .map(|&l| st.sgs[l as usize].rank)
                .max()
                .unwrap_or(0);
            if st.mark.len() < st.sgs.len() {
                st.mark.resize(st.sgs.len(), 0);
            }
            let ok = match rule {
                JoinRule::Exact => !st.reaches_any(s, &others, bound),
                JoinRule::Rank => {
                    others.is_empty()
                        || bound < st.sgs[s as usize].rank
                        || st.sgs[s as usize].succs.is_empty()
                }
            };
            if ok {
                best = Some(s);
                break;
            }
        }
        let chosen = match best {
            Some(s) => {
                let above = parents
                    .iter()
                    .filter(|&&l| l != s)
                    .map(|&l| st.sgs[l as usize].rank + 1)
                    .max()
                    .unwrap_or(0);
                st.raise(s, above);
                st.sgs[s as usize].size += 1;
                s
            }
            None => {
                let rank = parents
                    .iter()
                    .map(|&l| st.sgs[l as usize].rank + 1)
                    .max()
                    .unwrap_or(0);
                st.sgs.push(Sg {
                    rank,
                    size: 1,
                    device: dev,
                    succs: Vec::new(),
                });
                (st.sgs.len() - 1) as u32
            }
        };
        label[v as usize] = chosen;
        for &l in &parents {
            if l != chosen {
                st.add_edge(l, chosen);
            }
        }
    }
    label
}
