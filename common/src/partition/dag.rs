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
    /// Builds the DAG from edges `(from, to)` with `from < to` (callers
    /// number nodes topologically); duplicates are removed.
    pub fn new(device: Vec<DeviceIdx>, edges: Vec<(u32, u32)>) -> OpDag {
        let n = device.len();
        debug_assert!(edges.iter().all(|&(a, b)| a < b && (b as usize) < n));
        let (succ_off, succ) = csr(n, edges.iter().map(|&(a, b)| (a, b)), edges.len());
        let (pred_off, pred) = csr(n, edges.iter().map(|&(a, b)| (b, a)), edges.len());
        OpDag {
            succ_off,
            succ,
            pred_off,
            pred,
            device,
        }
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

    /// The same DAG with every edge reversed, renumbered so that node `v`
    /// becomes `len - 1 - v` (still topological).
    pub fn reversed(&self) -> OpDag {
        let n = self.len() as u32;
        let edges = (0..n)
            .flat_map(|v| self.succs(v).iter().map(move |&s| (n - 1 - s, n - 1 - v)))
            .collect();
        OpDag::new(self.device.iter().rev().copied().collect(), edges)
    }

    /// Number of distinct devices referenced.
    pub fn device_count(&self) -> usize {
        self.device
            .iter()
            .map(|&d| d as usize + 1)
            .max()
            .unwrap_or(0)
    }
}

/// CSR from unsorted `(row, col)` pairs (counting sort), each row sorted
/// and without duplicates.
pub(crate) fn csr(
    n: usize,
    pairs: impl Iterator<Item = (u32, u32)> + Clone,
    len: usize,
) -> (Vec<u32>, Vec<u32>) {
    let mut off = vec![0u32; n + 1];
    for (r, _) in pairs.clone() {
        off[r as usize + 1] += 1;
    }
    for i in 0..n {
        off[i + 1] += off[i];
    }
    let mut fill = off.clone();
    let mut cols = vec![0u32; len];
    for (r, c) in pairs {
        cols[fill[r as usize] as usize] = c;
        fill[r as usize] += 1;
    }
    // Sort and dedup each row, compacting in place.
    let mut write = 0usize;
    let mut start = 0usize;
    for r in 0..n {
        let end = off[r + 1] as usize;
        cols[start..end].sort_unstable();
        let row_start = write;
        for i in start..end {
            if write == row_start || cols[write - 1] != cols[i] {
                cols[write] = cols[i];
                write += 1;
            }
        }
        off[r] = row_start as u32;
        start = end;
    }
    off[n] = write as u32;
    cols.truncate(write);
    (off, cols)
}
