//! The compact op-only DAG the selection algorithms work on: op nodes
//! numbered `0..n` in the graph's topological order, adjacency in CSR form,
//! one device per node. Housekeeping nodes are not part of it.

use crate::affinity::DeviceIdx;

/// Op-node DAG in topological numbering (every edge goes from a lower to a
/// higher index).
#[derive(Debug, Clone)]
pub struct OpDag {
    succ_off: Vec<u32>,
    succ: Vec<u32>,
    pred_off: Vec<u32>,
    pred: Vec<u32>,
    /// Device of each node.
    pub device: Vec<DeviceIdx>,
}

impl OpDag {
    /// Builds the DAG from edges `(from, to)` with `from < to`; duplicates are
    /// removed. Panics in debug builds if an edge goes backwards (an internal
    /// invariant: callers number nodes topologically).
    pub fn new(device: Vec<DeviceIdx>, mut edges: Vec<(u32, u32)>) -> OpDag {
        let n = device.len();
        edges.sort_unstable();
        edges.dedup();
        debug_assert!(edges.iter().all(|&(a, b)| a < b && (b as usize) < n));
        let (succ_off, succ) = csr(n, edges.iter().map(|&(a, b)| (a, b)));
        let mut rev: Vec<(u32, u32)> = edges.iter().map(|&(a, b)| (b, a)).collect();
        rev.sort_unstable();
        let (pred_off, pred) = csr(n, rev.into_iter());
        OpDag { succ_off, succ, pred_off, pred, device }
    }

    pub fn len(&self) -> usize {
        self.device.len()
    }

    pub fn is_empty(&self) -> bool {
        self.device.is_empty()
    }

    pub fn edge_count(&self) -> usize {
        self.succ.len()
    }

    /// Successors of `v`, ascending.
    pub fn succs(&self, v: u32) -> &[u32] {
        &self.succ[self.succ_off[v as usize] as usize..self.succ_off[v as usize + 1] as usize]
    }

    /// Predecessors of `v`, ascending.
    pub fn preds(&self, v: u32) -> &[u32] {
        &self.pred[self.pred_off[v as usize] as usize..self.pred_off[v as usize + 1] as usize]
    }

    /// Number of distinct devices referenced.
    pub fn device_count(&self) -> usize {
        self.device.iter().map(|&d| d as usize + 1).max().unwrap_or(0)
    }
}

/// CSR from sorted `(row, col)` pairs.
fn csr(n: usize, pairs: impl Iterator<Item = (u32, u32)>) -> (Vec<u32>, Vec<u32>) {
    let mut off = vec![0u32; n + 1];
    let mut cols = Vec::new();
    for (r, c) in pairs {
        off[r as usize + 1] += 1;
        cols.push(c);
    }
    for i in 0..n {
        off[i + 1] += off[i];
    }
    (off, cols)
}
