//! Mending a dive that went wrong early: large neighbourhood search that packs a few bins' items again,
//! each part as a small search of its own.

use super::{xorshift, Search};
use crate::repack::{Instance, Item};

/// The steps one repair may take: a few bins' items, packed again.
const REPAIR_LIMIT: u64 = 20_000;

impl Search<'_> {
    /// Large neighbourhood search from the partial packing a dive left: empty a few of its bins at random and
    /// pack their items and the unplaced ones again, keeping the result when it leaves no more volume
    /// unplaced; until everything is placed or the budget is spent. A dive that goes wrong early cannot be
    /// mended by backtracking near the leaves; this mends it where it went wrong.
    pub(super) fn repair(
        &mut self,
        target: usize,
        mut partial: Vec<Option<usize>>,
        rng: &mut u64,
    ) -> Option<Vec<usize>> {
        let instance = self.instance;
        let unplaced = |placed: &[Option<usize>]| -> u64 {
            placed
                .iter()
                .zip(&instance.items)
                .filter(|(b, _)| b.is_none())
                .map(|(_, i)| i.size)
                .sum()
        };
        let mut failures = 0u64;
        while self.spent < self.budget {
            let mut closed: Vec<usize> = partial.iter().flatten().copied().collect();
            closed.sort_unstable();
            closed.dedup();
            let release = (3 + failures / 64).min(8) as usize;
            for k in 0..release.min(closed.len()) {
                let pick = k + (xorshift(rng) % (closed.len() - k) as u64) as usize;
                closed.swap(k, pick);
            }
            let release = release.min(closed.len());
            let mut kept = vec![false; instance.bins.len()];
            let mut touched = vec![false; instance.bins.len()];
            for (k, &b) in closed.iter().enumerate() {
                kept[b] = k >= release;
                touched[b] = true;
            }
            let target_part = target - (closed.len() - release);
            // Empty bins of one class beyond what the part may open are of no use to it.
            let mut per_class = vec![0; instance.bins.len()];
            let sub_bins: Vec<usize> = (0..instance.bins.len())
                .filter(|&b| {
                    if kept[b] {
                        return false;
                    }
                    if touched[b] || instance.bins[b].fixed {
                        return true;
                    }
                    per_class[self.bin_class[b]] += 1;
                    per_class[self.bin_class[b]] <= target_part
                })
                .collect();
            let sub_items: Vec<usize> = (0..instance.items.len())
                .filter(|&i| partial[i].is_none_or(|b| !kept[b]))
                .collect();
            let mut machines = instance.machines.clone();
            for (i, b) in partial.iter().enumerate() {
                if let Some(b) = b.filter(|&b| kept[b]) {
                    let m = &mut machines[instance.bins[b].machine];
                    m.cpu_cores -= instance.items[i].needs.cpu_cores;
                    m.memory -= instance.items[i].needs.memory;
                }
            }
            let sub = Instance {
                bins: sub_bins.iter().map(|&b| instance.bins[b].clone()).collect(),
                machines,
                items: sub_items
                    .iter()
                    .map(|&i| {
                        let item = &instance.items[i];
                        let at = |bin: usize| sub_bins.iter().position(|&b| b == bin);
                        Item {
                            // Restarts are not weighed while bins are counted: any bin of the part will do.
                            origin: at(item.origin).unwrap_or(0),
                            home: item.home.and_then(at),
                            ..item.clone()
                        }
                    })
                    .collect(),
                kinds: instance
                    .kinds
                    .iter()
                    .map(|kind| sub_bins.iter().map(|&b| kind[b]).collect())
                    .collect(),
            };
            let search = Search::new(&sub, REPAIR_LIMIT);
            let left = self.budget - self.spent;
            let mut state = search.state(target_part, REPAIR_LIMIT.min(left), true, xorshift(rng));
            search.dfs(&mut state);
            // Setting the part up costs about as much as a step per bin for each eight items.
            self.spent += state.steps + (sub.bins.len() * sub.items.len() / 8) as u64 + 100;
            let mut merged = partial.clone();
            let placed = match &state.best {
                Some((bins, _)) => bins.iter().map(|&b| Some(b)).collect(),
                None => state.deepest_placed,
            };
            for (&i, b) in sub_items.iter().zip(placed) {
                merged[i] = b.map(|b| sub_bins[b]);
            }
            if state.best.is_some() {
                return Some(merged.into_iter().map(|b| b.expect("all placed")).collect());
            }
            if unplaced(&merged) <= unplaced(&partial) {
                partial = merged;
            }
            failures += 1;
        }
        None
    }
}
