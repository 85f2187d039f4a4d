//! Which hosts each copy of a network gets: hosts dealt to copies by
//! capacity so that the copies come out as even as the hosts allow, and
//! the numbers of copies `auto` considers.

use std::collections::BTreeMap;

use crate::affinity::{AnalyticCostModel, DeviceId};

/// The hosts of `devices` in priority order (first appearance), each with
/// its capacity: the sum of its devices' GFLOP/s in `cost`. Devices
/// without a host (a single machine) make one host named "".
pub fn hosts(devices: &[DeviceId], cost: &AnalyticCostModel) -> Vec<(String, f64)> {
    let mut order: Vec<String> = Vec::new();
    let mut capacity: BTreeMap<String, f64> = BTreeMap::new();
    for d in devices {
        let host = d.host.clone().unwrap_or_default();
        if !order.contains(&host) {
            order.push(host.clone());
        }
        *capacity.entry(host).or_default() += cost.profile(d).gflops;
    }
    order
        .into_iter()
        .map(|h| {
            let c = capacity.get(&h).copied().unwrap_or_default();
            (h, c)
        })
        .collect()
}

/// Deals `hosts` to `k` groups (`1 ≤ k ≤ hosts.len()`): largest capacity
/// first, in snake order (0, 1, …, k-1, k-1, …, 0, …) so that group
/// capacities come out even. Each group lists its hosts in their original
/// (priority) order.
pub fn deal(hosts: &[(String, f64)], k: usize) -> Vec<Vec<String>> {
    let k = k.clamp(1, hosts.len().max(1));
    let mut by_capacity: Vec<usize> = (0..hosts.len()).collect();
    // Stable: equal capacities keep the priority order.
    by_capacity.sort_by(|&a, &b| hosts[b].1.total_cmp(&hosts[a].1));
    let mut group_of = vec![0usize; hosts.len()];
    for (i, &h) in by_capacity.iter().enumerate() {
        let (round, pos) = (i / k, i % k);
        group_of[h] = if round % 2 == 0 { pos } else { k - 1 - pos };
    }
    let mut groups = vec![Vec::new(); k];
    for (h, (name, _)) in hosts.iter().enumerate() {
        groups[group_of[h]].push(name.clone());
    }
    groups.retain(|g| !g.is_empty());
    groups
}

/// Numbers of copies `auto` weighs for `hosts` hosts: every count up to
/// 16, beyond that powers of two and the host count itself.
pub fn candidate_counts(hosts: usize) -> Vec<usize> {
    if hosts <= 16 {
        return (1..=hosts).collect();
    }
    let mut counts: Vec<usize> = std::iter::successors(Some(1usize), |k| Some(k * 2))
        .take_while(|&k| k < hosts)
        .collect();
    counts.push(hosts);
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(caps: &[f64]) -> Vec<(String, f64)> {
        caps.iter()
            .enumerate()
            .map(|(i, &c)| (format!("h{i}"), c))
            .collect()
    }

    #[test]
    fn dealing_balances_capacity_and_keeps_priority_order() {
        let hosts = named(&[10.0, 40.0, 20.0, 30.0]);
        let groups = deal(&hosts, 2);
        // 40 → g0, 30 → g1, 20 → g1, 10 → g0: 50 and 50.
        assert_eq!(groups, vec![vec!["h0", "h1"], vec!["h2", "h3"]]);
        assert_eq!(deal(&hosts, 1), vec![vec!["h0", "h1", "h2", "h3"]]);
        assert_eq!(deal(&hosts, 4).len(), 4);
        // More groups than hosts: one host each.
        assert_eq!(deal(&hosts, 9).len(), 4);
    }

    #[test]
    fn candidates_cover_small_clusters_and_sample_large_ones() {
        assert_eq!(candidate_counts(3), vec![1, 2, 3]);
        let big = candidate_counts(1000);
        assert_eq!(big.first(), Some(&1));
        assert_eq!(big.last(), Some(&1000));
        assert!(big.contains(&512) && big.len() == 11);
    }
}
