//! Merging adjacent subgraphs of the same device while the subgraph graph
//! stays acyclic.
//!
//! Contracting an edge `S → T` is safe exactly when no other path leads from
//! `S` to `T`. The pass keeps a topological numbering of the subgraph graph
//! (Pearce–Kelly style): the search for another path only visits subgraphs
//! numbered between `S` and `T`, and after a contraction only the subgraphs
//! found by that search (those reachable from `S`) and the ones reaching `T`
//! inside the same window are renumbered. Paths survive contractions, so an
//! edge that cannot be contracted never becomes contractible later and one
//! sweep reaches the fixpoint.

use super::dag::OpDag;

struct Contractor {
    parent: Vec<u32>,
    succ: Vec<Vec<u32>>,
    pred: Vec<Vec<u32>>,
    pos: Vec<u64>,
    device: Vec<u16>,
    mark: Vec<u32>,
    epoch: u32,
}

impl Contractor {
    fn find(&mut self, mut x: u32) -> u32 {
        while self.parent[x as usize] != x {
            let p = self.parent[x as usize];
            self.parent[x as usize] = self.parent[p as usize];
            x = p;
        }
        x
    }

    /// Current successors (or predecessors) of representative `x`,
    /// normalized in place.
    fn neighbours(&mut self, x: u32, forward: bool) -> Vec<u32> {
        let mut list = std::mem::take(if forward { &mut self.succ[x as usize] } else { &mut self.pred[x as usize] });
        for v in list.iter_mut() {
            *v = self.find(*v);
        }
        list.sort_unstable();
        list.dedup();
        list.retain(|&v| v != x);
        let out = list.clone();
        if forward {
            self.succ[x as usize] = list;
        } else {
            self.pred[x as usize] = list;
        }
        out
    }

    /// Nodes reachable from `start` (exclusive) in direction `forward`, whose
    /// position lies strictly between `lo` and `hi`; `None` if `target` is
    /// reached other than through the direct edge `start → target`.
    fn window_search(&mut self, start: u32, target: u32, forward: bool, lo: u64, hi: u64) -> Option<Vec<u32>> {
        self.epoch += 1;
        let epoch = self.epoch;
        let mut found = Vec::new();
        let mut stack = vec![start];
        while let Some(x) = stack.pop() {
            for y in self.neighbours(x, forward) {
                if y == target {
                    if x == start {
                        continue;
                    }
                    return None;
                }
                let p = self.pos[y as usize];
                if p <= lo || p >= hi || self.mark[y as usize] == epoch {
                    continue;
                }
                self.mark[y as usize] = epoch;
                found.push(y);
                stack.push(y);
            }
        }
        Some(found)
    }

    /// Contracts `s → t` if no other path joins them. Returns success.
    fn try_contract(&mut self, s: u32, t: u32) -> bool {
        let (ps, pt) = (self.pos[s as usize], self.pos[t as usize]);
        let Some(after) = self.window_search(s, t, true, ps, pt) else { return false };
        // A second path would already have been found forward; stay safe anyway.
        let Some(before) = self.window_search(t, s, false, ps, pt) else { return false };
        // Renumber: [subgraphs reaching t] [s+t] [subgraphs reached from s],
        // reusing the positions they held (one slot becomes a hole).
        let mut slots: Vec<u64> = after.iter().chain(&before).map(|&x| self.pos[x as usize]).collect();
        slots.push(ps);
        slots.push(pt);
        slots.sort_unstable();
        let by_pos = |c: &Contractor, v: &mut Vec<u32>| v.sort_unstable_by_key(|&x| c.pos[x as usize]);
        let (mut after, mut before) = (after, before);
        by_pos(self, &mut after);
        by_pos(self, &mut before);
        let mut slot = slots.into_iter().skip(1);
        for x in before.into_iter().chain(std::iter::once(s)).chain(after) {
            self.pos[x as usize] = slot.next().unwrap_or(u64::MAX);
        }
        self.parent[t as usize] = s;
        let ts = std::mem::take(&mut self.succ[t as usize]);
        let tp = std::mem::take(&mut self.pred[t as usize]);
        self.succ[s as usize].extend(ts);
        self.pred[s as usize].extend(tp);
        true
    }
}

/// Merges subgraphs given as labels over `dag`; returns new labels.
pub fn merge(dag: &OpDag, labels: &[u32]) -> Vec<u32> {
    let k = labels.iter().map(|&l| l as usize + 1).max().unwrap_or(0);
    let mut device = vec![0u16; k];
    let mut edges: Vec<(u32, u32)> = Vec::new();
    for v in 0..dag.len() as u32 {
        let lv = labels[v as usize];
        device[lv as usize] = dag.device[v as usize];
        for &s in dag.succs(v) {
            let ls = labels[s as usize];
            if ls != lv {
                edges.push((lv, ls));
            }
        }
    }
    edges.sort_unstable();
    edges.dedup();
    let mut succ = vec![Vec::new(); k];
    let mut pred = vec![Vec::new(); k];
    let mut indeg = vec![0u32; k];
    for &(a, b) in &edges {
        succ[a as usize].push(b);
        pred[b as usize].push(a);
        indeg[b as usize] += 1;
    }
    // Topological numbering of the subgraph graph (Kahn, lowest label first).
    let mut order = Vec::with_capacity(k);
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<u32>> =
        (0..k as u32).filter(|&l| indeg[l as usize] == 0).map(std::cmp::Reverse).collect();
    while let Some(std::cmp::Reverse(l)) = ready.pop() {
        order.push(l);
        for &s in &succ[l as usize] {
            indeg[s as usize] -= 1;
            if indeg[s as usize] == 0 {
                ready.push(std::cmp::Reverse(s));
            }
        }
    }
    let mut pos = vec![0u64; k];
    for (i, &l) in order.iter().enumerate() {
        pos[l as usize] = i as u64 * 2;
    }
    let mut c = Contractor {
        parent: (0..k as u32).collect(),
        succ,
        pred,
        pos,
        device,
        mark: vec![0; k],
        epoch: 0,
    };
    for &s in &order {
        if c.find(s) != s {
            continue;
        }
        loop {
            let dev = c.device[s as usize];
            let candidates: Vec<u32> = c
                .neighbours(s, true)
                .into_iter()
                .filter(|&t| c.device[t as usize] == dev)
                .collect();
            let mut merged = false;
            for t in candidates {
                if c.try_contract(s, t) {
                    merged = true;
                }
            }
            if !merged {
                break;
            }
        }
    }
    labels.iter().map(|&l| c.find(l)).collect()
}
