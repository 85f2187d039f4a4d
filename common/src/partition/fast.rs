//! `fast` subgraph selection: one pass over the nodes in topological order,
//! in the spirit of TVM's restriction map (seed 002), kept near-linear with
//! *ranks* instead of restriction sets.
//!
//! Every subgraph has a rank, and every edge between two subgraphs goes from
//! a lower to a higher rank, so the subgraph graph is acyclic by
//! construction. A node joins a parent subgraph `S` of its own device when
//! every other parent subgraph has a lower rank than `S`, or when no path has
//! left `S` yet (then nothing can lead from `S` back to the node's other
//! parents, and `S`'s rank is raised above theirs). Otherwise it opens a new
//! subgraph ranked above all its parents. A data path that leaves a subgraph
//! therefore never re-enters it: the RFC's A→B→C→D example (A,B,D on one
//! device, C on another) gives [A,B], [C], [D].

use super::dag::OpDag;

struct Sg {
    rank: u32,
    /// Some edge leaves this subgraph (towards another subgraph).
    has_out: bool,
    size: u32,
    device: u16,
}

/// Returns a subgraph label per node.
pub fn select(dag: &OpDag) -> Vec<u32> {
    let n = dag.len();
    let mut label = vec![u32::MAX; n];
    let mut sgs: Vec<Sg> = Vec::new();
    let mut parents: Vec<u32> = Vec::with_capacity(8);
    for v in 0..n as u32 {
        let dev = dag.device[v as usize];
        parents.clear();
        for &p in dag.preds(v) {
            let l = label[p as usize];
            if !parents.contains(&l) {
                parents.push(l);
            }
        }
        // The two highest parent ranks, to know "max rank of the others".
        let (mut top, mut second) = (None::<(u32, u32)>, None::<u32>);
        for &l in &parents {
            let r = sgs[l as usize].rank;
            match top {
                Some((_, tr)) if r <= tr => second = Some(second.map_or(r, |s| s.max(r))),
                _ => {
                    if let Some((_, tr)) = top {
                        second = Some(second.map_or(tr, |s| s.max(tr)));
                    }
                    top = Some((l, r));
                }
            }
        }
        let max_other = |l: u32| -> Option<u32> {
            match top {
                Some((tl, _)) if tl == l => second,
                Some((_, tr)) => Some(tr),
                None => None,
            }
        };
        let mut best: Option<u32> = None;
        for &l in &parents {
            let s = &sgs[l as usize];
            if s.device != dev {
                continue;
            }
            let ok = match max_other(l) {
                None => true,
                Some(other) => other < s.rank || !s.has_out,
            };
            if ok && best.is_none_or(|b| s.size > sgs[b as usize].size) {
                best = Some(l);
            }
        }
        let chosen = match best {
            Some(l) => {
                if let Some(other) = max_other(l) {
                    let s = &mut sgs[l as usize];
                    if other >= s.rank {
                        s.rank = other + 1;
                    }
                }
                sgs[l as usize].size += 1;
                l
            }
            None => {
                let rank = parents.iter().map(|&l| sgs[l as usize].rank + 1).max().unwrap_or(0);
                sgs.push(Sg { rank, has_out: false, size: 1, device: dev });
                (sgs.len() - 1) as u32
            }
        };
        label[v as usize] = chosen;
        for &l in &parents {
            if l != chosen {
                sgs[l as usize].has_out = true;
            }
        }
    }
    label
}
