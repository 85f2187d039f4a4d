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
//! pass over the subgraphs reaches the fixpoint.

use super::dag::{csr, OpDag};

/// One direction of the subgraph graph's adjacency: the initial lists in CSR
/// form plus, for subgraphs that absorbed others or were normalized, an
/// owned list. Entries may be stale (absorbed ids) or repeated; readers map
/// them through `find`. Keeps the common case free of per-node allocations.
struct Adjacency {
    off: Vec<u32>,
    cols: Vec<u32>,
    /// The CSR row still belongs to the node's list.
    live: Vec<bool>,
    extra: Vec<Vec<u32>>,
}

impl Adjacency {
    fn new(k: usize, pairs: impl Iterator<Item = (u32, u32)> + Clone, len: usize) -> Adjacency {
        let (off, cols) = csr(k, pairs, len);
        Adjacency {
            off,
            cols,
            live: vec![true; k],
            extra: vec![Vec::new(); k],
        }
    }

    fn row(&self, x: u32) -> &[u32] {
        if self.live[x as usize] {
            &self.cols[self.off[x as usize] as usize..self.off[x as usize + 1] as usize]
        } else {
            &[]
        }
    }

    fn len(&self, x: u32) -> usize {
        self.row(x).len() + self.extra[x as usize].len()
    }

    fn at(&self, x: u32, i: usize) -> u32 {
        let row = self.row(x);
        if i < row.len() {
            row[i]
        } else {
            self.extra[x as usize][i - row.len()]
        }
    }

    /// Removes and returns the whole list of `x`.
    fn take(&mut self, x: u32) -> Vec<u32> {
        let mut list = std::mem::take(&mut self.extra[x as usize]);
        list.extend_from_slice(self.row(x));
        self.live[x as usize] = false;
        list
    }

    fn absorb(&mut self, keep: u32, gone: u32) {
        let list = self.take(gone);
        if self.extra[keep as usize].is_empty() && !self.live[keep as usize] {
            self.extra[keep as usize] = list;
        } else {
            self.extra[keep as usize].extend(list);
        }
    }
}

struct Contractor {
    parent: Vec<u32>,
    succ: Adjacency,
    pred: Adjacency,
    pos: Vec<u64>,
    device: Vec<u16>,
    size: Vec<u32>,
    mark: Vec<u32>,
    epoch: u32,
    // Reused buffers.
    stack: Vec<u32>,
    after: Vec<u32>,
    before: Vec<u32>,
    slots: Vec<u64>,
    /// Search for other paths (exact); otherwise only the O(degree) checks.
    exhaustive: bool,
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

    fn adj(&self, forward: bool) -> &Adjacency {
        if forward {
            &self.succ
        } else {
            &self.pred
        }
    }

    /// Current successors (or predecessors) of representative `x`,
    /// normalized in place and copied into `out`.
    fn neighbours(&mut self, x: u32, forward: bool, out: &mut Vec<u32>) {
        let mut list = if forward {
            self.succ.take(x)
        } else {
            self.pred.take(x)
        };
        for v in list.iter_mut() {
            *v = self.find(*v);
        }
        list.sort_unstable();
        list.dedup();
        list.retain(|&v| v != x);
        out.clear();
        out.extend_from_slice(&list);
        if forward {
            self.succ.extra[x as usize] = list;
        } else {
            self.pred.extra[x as usize] = list;
        }
    }

    /// Fills `found` with the subgraphs reachable from `start` (exclusive) in
    /// direction `forward` whose position lies strictly between `lo` and
    /// `hi`; false if `target` is reached other than through the direct edge
    /// `start → target`.
    fn window_search(
        &mut self,
        start: u32,
        target: u32,
        forward: bool,
        (lo, hi): (u64, u64),
        found: &mut Vec<u32>,
    ) -> bool {
        self.epoch += 1;
        let epoch = self.epoch;
        found.clear();
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        stack.push(start);
        let mut ok = true;
        'search: while let Some(x) = stack.pop() {
            let len = self.adj(forward).len(x);
            for i in 0..len {
                let raw = self.adj(forward).at(x, i);
                let y = self.find(raw);
                if y == x {
                    continue;
                }
                if y == target {
                    if x == start {
                        continue;
                    }
                    ok = false;
                    break 'search;
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
        self.stack = stack;
        ok
    }

    /// Whether `x` has a neighbour other than `other` positioned strictly
    /// inside `(lo, hi)`.
    fn neighbour_in_window(
        &mut self,
        x: u32,
        other: u32,
        forward: bool,
        (lo, hi): (u64, u64),
    ) -> bool {
        let len = self.adj(forward).len(x);
        (0..len).any(|i| {
            let raw = self.adj(forward).at(x, i);
            let y = self.find(raw);
            y != x && y != other && (lo + 1..hi).contains(&self.pos[y as usize])
        })
    }

    fn absorb(&mut self, s: u32, t: u32, keep: u32) {
        let gone = if keep == s { t } else { s };
        self.parent[gone as usize] = keep;
        self.size[keep as usize] += self.size[gone as usize];
        self.succ.absorb(keep, gone);
        self.pred.absorb(keep, gone);
    }

    /// Contracts the edge `s → t` if no other path joins them, keeping
    /// `keep` (one of the two) as the representative. Returns success.
    fn try_contract(&mut self, s: u32, t: u32, keep: u32) -> bool {
        let window = (self.pos[s as usize], self.pos[t as usize]);
        // Common cases in O(degree): nothing leaves `s` into the window (the
        // merged subgraph takes `t`'s place), or nothing enters `t` from it
        // (it takes `s`'s place). Either way no other path exists.
        if !self.neighbour_in_window(s, t, true, window) {
            self.absorb(s, t, keep);
            self.pos[keep as usize] = window.1;
            return true;
        }
        if !self.neighbour_in_window(t, s, false, window) {
            self.absorb(s, t, keep);
            self.pos[keep as usize] = window.0;
            return true;
        }
        if !self.exhaustive {
            return false;
        }
        let (mut after, mut before) = (
            std::mem::take(&mut self.after),
            std::mem::take(&mut self.before),
        );
        // A second path is found forward; the backward search cannot find one.
        let ok = self.window_search(s, t, true, window, &mut after)
            && self.window_search(t, s, false, window, &mut before);
        if ok {
            // Renumber: [subgraphs reaching t] [s+t] [subgraphs reached from
            // s], reusing the positions they held (one slot becomes a hole).
            let mut slots = std::mem::take(&mut self.slots);
            slots.clear();
            slots.extend(after.iter().chain(&before).map(|&x| self.pos[x as usize]));
            slots.push(window.0);
            slots.push(window.1);
            slots.sort_unstable();
            after.sort_unstable_by_key(|&x| self.pos[x as usize]);
            before.sort_unstable_by_key(|&x| self.pos[x as usize]);
            for (&x, &slot) in before
                .iter()
                .chain(std::iter::once(&keep))
                .chain(&after)
                .zip(&slots[1..])
            {
                self.pos[x as usize] = slot;
            }
            self.slots = slots;
            self.absorb(s, t, keep);
        }
        self.after = after;
        self.before = before;
        ok
    }
}

/// The order in which the merge pass tries contractions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeOrder {
    /// Device by device in priority order, subgraphs in topological order.
    DevicePriority,
    /// Largest subgraphs first.
    LargestFirst,
    /// Shortest edges (in the topological numbering) first.
    Window,
    /// Device priority order, contracting only what the O(degree) checks
    /// prove safe (no search): strictly linear, for very large graphs.
    Local,
}

/// Merges subgraphs given as labels over `dag`; returns new labels.
pub fn merge(dag: &OpDag, labels: &[u32]) -> Vec<u32> {
    merge_in_order(dag, labels, MergeOrder::DevicePriority)
}

/// [`merge`] with a chosen contraction order.
pub fn merge_in_order(dag: &OpDag, labels: &[u32], order_kind: MergeOrder) -> Vec<u32> {
    let (mut c, order, edges) = quotient(dag, labels, order_kind != MergeOrder::Local);
    if order_kind == MergeOrder::Window {
        merge_shortest_edges(&mut c, &edges);
    } else {
        // Grow each subgraph through its same-device neighbours in both
        // directions until nothing more can join.
        let mut buf = Vec::new();
        for s in growth_order(&c, &order, order_kind) {
            if c.find(s) != s {
                continue;
            }
            if c.exhaustive {
                grow(&mut c, s, &mut buf);
            } else {
                grow_linear(&mut c, s);
            }
        }
    }
    merge_sources(&mut c, &order);
    labels.iter().map(|&l| c.find(l)).collect()
}

/// The subgraph graph of `labels` over `dag`, ready for contraction; its
/// topological order (Kahn) and its edges.
fn quotient(
    dag: &OpDag,
    labels: &[u32],
    exhaustive: bool,
) -> (Contractor, Vec<u32>, Vec<(u32, u32)>) {
    let k = labels.iter().map(|&l| l as usize + 1).max().unwrap_or(0);
    let mut device = vec![0u16; k];
    let mut size = vec![0u32; k];
    let mut edges: Vec<(u32, u32)> = Vec::new();
    for v in 0..dag.len() as u32 {
        let lv = labels[v as usize];
        device[lv as usize] = dag.device[v as usize];
        size[lv as usize] += 1;
        for &s in dag.succs(v) {
            let ls = labels[s as usize];
            if ls != lv {
                edges.push((lv, ls));
            }
        }
    }
    // Rows come out sorted and without duplicates.
    let succ = Adjacency::new(k, edges.iter().copied(), edges.len());
    let pred = Adjacency::new(k, edges.iter().map(|&(a, b)| (b, a)), edges.len());
    let mut indeg = vec![0u32; k];
    for &b in &succ.cols {
        indeg[b as usize] += 1;
    }
    let mut order: Vec<u32> = (0..k as u32).filter(|&l| indeg[l as usize] == 0).collect();
    let mut head = 0;
    while head < order.len() {
        let l = order[head];
        head += 1;
        for &s in succ.row(l) {
            indeg[s as usize] -= 1;
            if indeg[s as usize] == 0 {
                order.push(s);
            }
        }
    }
    let mut pos = vec![0u64; k];
    for (i, &l) in order.iter().enumerate() {
        pos[l as usize] = i as u64 * 2;
    }
    let c = Contractor {
        parent: (0..k as u32).collect(),
        succ,
        pred,
        pos,
        device,
        size,
        mark: vec![0; k],
        epoch: 0,
        stack: Vec::new(),
        after: Vec::new(),
        before: Vec::new(),
        slots: Vec::new(),
        exhaustive,
    };
    (c, order, edges)
}

/// [`MergeOrder::Window`]: same-device edges contracted shortest first
/// (by distance in the topological numbering, kept current as it shifts).
fn merge_shortest_edges(c: &mut Contractor, edges: &[(u32, u32)]) {
    let mut buf = Vec::new();
    let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u32, u32)>> = edges
        .iter()
        .filter(|&&(a, b)| c.device[a as usize] == c.device[b as usize])
        .map(|&(a, b)| std::cmp::Reverse((c.pos[b as usize] - c.pos[a as usize], a, b)))
        .collect();
    while let Some(std::cmp::Reverse((w, a, b))) = heap.pop() {
        let (a, b) = (c.find(a), c.find(b));
        if a == b {
            continue;
        }
        let now = c.pos[b as usize].saturating_sub(c.pos[a as usize]);
        if now != w {
            heap.push(std::cmp::Reverse((now, a, b)));
            continue;
        }
        if !c.try_contract(a, b, a) {
            continue;
        }
        let dev = c.device[a as usize];
        c.neighbours(a, true, &mut buf);
        for &t in &buf {
            if c.device[t as usize] == dev {
                let w = c.pos[t as usize].saturating_sub(c.pos[a as usize]);
                heap.push(std::cmp::Reverse((w, a, t)));
            }
        }
        c.neighbours(a, false, &mut buf);
        for &p in &buf {
            if c.device[p as usize] == dev {
                let w = c.pos[a as usize].saturating_sub(c.pos[p as usize]);
                heap.push(std::cmp::Reverse((w, p, a)));
            }
        }
    }
}

/// The order in which subgraphs grow: largest first, or device by device
/// in priority order (a stable counting sort keeps topological order).
fn growth_order(c: &Contractor, order: &[u32], order_kind: MergeOrder) -> Vec<u32> {
    if order_kind == MergeOrder::LargestFirst {
        let mut v = order.to_vec();
        v.sort_by_key(|&l| (std::cmp::Reverse(c.size[l as usize]), c.pos[l as usize]));
        return v;
    }
    let devices = c.device.iter().map(|&d| d as usize + 1).max().unwrap_or(0);
    let mut start = vec![0usize; devices + 1];
    for &l in order {
        start[c.device[l as usize] as usize + 1] += 1;
    }
    for d in 0..devices {
        start[d + 1] += start[d];
    }
    let mut v = vec![0u32; order.len()];
    for &l in order {
        let d = c.device[l as usize] as usize;
        v[start[d]] = l;
        start[d] += 1;
    }
    v
}

/// Grows `s` through same-device neighbours until none can join, with the
/// exhaustive cycle checks.
fn grow(c: &mut Contractor, s: u32, buf: &mut Vec<u32>) {
    let dev = c.device[s as usize];
    loop {
        let mut merged = false;
        c.neighbours(s, true, buf);
        for &t in buf.iter() {
            if c.device[t as usize] == dev && c.find(t) == t {
                merged |= c.try_contract(s, t, s);
            }
        }
        c.neighbours(s, false, buf);
        for &p in buf.iter() {
            if c.device[p as usize] == dev && c.find(p) == p {
                merged |= c.try_contract(p, s, s);
            }
        }
        if !merged {
            break;
        }
    }
}

/// [`grow`] in linear mode ([`MergeOrder::Local`]): raw adjacency lists,
/// no normalization; duplicates cost an O(degree) check each.
fn grow_linear(c: &mut Contractor, s: u32) {
    let dev = c.device[s as usize];
    loop {
        let mut merged = false;
        for forward in [true, false] {
            let mut i = 0;
            while i < c.adj(forward).len(s) {
                let raw = c.adj(forward).at(s, i);
                i += 1;
                let y = c.find(raw);
                if y == s || c.device[y as usize] != dev {
                    continue;
                }
                merged |= if forward {
                    c.try_contract(s, y, s)
                } else {
                    c.try_contract(y, s, s)
                };
            }
        }
        if !merged {
            break;
        }
    }
}

/// Merges the subgraphs that read no other subgraph (they read only graph
/// inputs and constants), device by device. No path can enter a source, so
/// no merge of sources can close a cycle. Constant subexpressions that a
/// device cannot fold into their consumers (e.g. a `Cast` of a weight on a
/// CPU) then form one prologue instead of many tiny subgraphs.
fn merge_sources(c: &mut Contractor, order: &[u32]) {
    let mut first_source: Vec<Option<u32>> = Vec::new();
    let mut buf = Vec::new();
    for &x in order {
        if c.find(x) != x {
            continue;
        }
        c.neighbours(x, false, &mut buf);
        if !buf.is_empty() {
            continue;
        }
        let dev = c.device[x as usize] as usize;
        if first_source.len() <= dev {
            first_source.resize(dev + 1, None);
        }
        match first_source[dev] {
            None => first_source[dev] = Some(x),
            Some(keep) => {
                // Both are sources: the merged one may sit at the earlier
                // position, before every successor of either.
                let pos = c.pos[keep as usize].min(c.pos[x as usize]);
                c.absorb(keep, x, keep);
                c.pos[keep as usize] = pos;
            }
        }
    }
}
