//! Mending a packing: large neighbourhood search that packs a few bins' items again, each part as a small
//! search of its own. It mends a dive that went wrong early, and it frees GPUs from the fleet as it is.

use super::{xorshift, Search};
use crate::repack::{Instance, Item, Packing};

/// The steps one repair may take: a few bins' items, packed again.
const REPAIR_LIMIT: u64 = 20_000;

/// The most bins one repair packs again: where what is unplaced needs the room of more, a part that large
/// is a search from scratch in all but name.
const MAX_RELEASE: usize = 48;

impl Search<'_> {
    /// Frees `n` bins starting from where everything is now, one bin at a time, the cheapest to empty first:
    /// its items are taken out and the packing is mended around them. Where every GPU's room left is smaller
    /// than any item, no item moves to a GPU in use without others making room, which emptying GPUs one at a
    /// time ([`super::super::evacuate`]) cannot do; and a packing from scratch moves nearly everything.
    pub(in crate::repack::pack) fn free_from_now(&mut self, n: usize) -> Option<Packing> {
        let instance = self.instance;
        let now = instance.used_now();
        let mut bins: Vec<usize> = instance.items.iter().map(|i| i.origin).collect();
        let mut rng = 0x9E37_79B9_7F4A_7C15;
        while instance.used(&bins) + n > now {
            // What emptying each bin would cost: its items' restarts. A bin that took work while others were
            // emptied is left as it is (as emptying GPUs one at a time leaves it): it was filled to make room.
            let mut cost = vec![Some(0); instance.bins.len()];
            let mut held = vec![false; instance.bins.len()];
            for (item, &b) in instance.items.iter().zip(&bins) {
                held[b] = true;
                cost[b] = cost[b]
                    .filter(|_| item.origin == b)
                    .map(|c| c + item.cost());
            }
            let (_, emptied) = cost
                .iter()
                .enumerate()
                .filter(|&(b, _)| held[b] && !instance.bins[b].fixed)
                .filter_map(|(b, c)| c.map(|c| (c, b)))
                .min()?;
            let partial = bins.iter().map(|&b| (b != emptied).then_some(b)).collect();
            bins = self.repair(instance.used(&bins) - 1, partial, true, &mut rng)?;
        }
        Some(self.relabel(&bins))
    }

    /// Large neighbourhood search from the partial packing a dive left: empty a few of its bins at random and
    /// pack their items and the unplaced ones again, keeping the result when it leaves no more volume
    /// unplaced; until everything is placed or the budget is spent. A dive that goes wrong early cannot be
    /// mended by backtracking near the leaves; this mends it where it went wrong.
    ///
    /// `whole`: what is unplaced is to be placed in one part (a bin being freed), so each part takes as many
    /// bins as its room needs.
    pub(super) fn repair(
        &mut self,
        target: usize,
        mut partial: Vec<Option<usize>>,
        whole: bool,
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
            // A few bins at random; freeing a bin, more while the room they have left is short of what it
            // held: fewer could never take it. (A failed dive leaves too much unplaced for that: its part
            // need only leave no more unplaced than before.)
            let mut load = vec![0; if whole { instance.bins.len() } else { 0 }];
            if whole {
                for (item, b) in instance.items.iter().zip(&partial) {
                    if let Some(b) = b {
                        load[*b] += item.size;
                    }
                }
            }
            let need = if whole { unplaced(&partial) } else { 0 };
            let at_least = (3 + failures / 64).min(8) as usize;
            let mut release = 0;
            let mut room_left = 0;
            while release < closed.len().min(MAX_RELEASE)
                && (release < at_least || (whole && room_left < need))
            {
                let pick = release + (xorshift(rng) % (closed.len() - release) as u64) as usize;
                closed.swap(release, pick);
                let b = closed[release];
                if whole {
                    room_left += instance.bins[b].room.saturating_sub(load[b]);
                }
                release += 1;
            }
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
