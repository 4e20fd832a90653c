//! The search proper: bin completion over one target count of bins, its state, and the relabelling that puts
//! each set it found on the bin of its class where it saves most restarts. How one bin's sets are listed and
//! how a failed dive is mended are rooms of their own below it.

mod fills;
mod repair;

use super::{Instance, Packing, Room};
use fills::{shuffle_ties, Fill, Sets};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

pub(super) struct Search<'a> {
    instance: &'a Instance,
    /// Items by size, largest first; equal items next to each other.
    order: Vec<usize>,
    /// Sizes in `order`.
    sizes: Vec<u64>,
    /// Items interchangeable for the count of bins share a class.
    item_class: Vec<usize>,
    /// Items interchangeable for restarts too (the same origin) share a class.
    item_class_exact: Vec<usize>,
    /// Bins that are interchangeable share a class.
    bin_class: Vec<usize>,
    /// Non-fixed bins, roomiest first: what the bound may still open.
    openable: Vec<usize>,
    pub(super) budget: u64,
    pub(super) spent: u64,
}

/// One attempt's state.
struct State {
    target: usize,
    placed: Vec<Option<usize>>,
    closed: Vec<bool>,
    machines: Vec<Room>,
    used: usize,
    volume_left: u64,
    /// What the moves so far cost ([`Item::cost`](super::Item::cost)).
    moves: u64,
    limit: u64,
    steps: u64,
    /// Stop at the first packing (find one), or go on for fewer restarts.
    first: bool,
    rng: u64,
    best: Option<(Vec<usize>, u64)>,
    /// False once some bin's sets were cut at [`MAX_FILLS`]: the search then proves nothing.
    complete: bool,
    /// The most bins closed at once, and what was placed then: where a repair starts.
    deepest: usize,
    deepest_placed: Vec<Option<usize>>,
    closed_count: usize,
}

/// The most sets tried for one bin: a GPU with many small sharers has more ways to fill it than any search
/// can try, and the fullest (found first) are the ones worth trying.
const MAX_FILLS: usize = 256;

/// How many of the largest unplaced items are weighed for the one with the fewest ways to be placed.
const WINDOW: usize = 12;

impl<'a> Search<'a> {
    pub(super) fn new(instance: &'a Instance, budget: u64) -> Search<'a> {
        // Each item's bins as a vector shared by the items alike (its kind's, with its home where the kind
        // lacks it): two items may go to the same bins exactly when they share one, and two bins take the
        // same items exactly when these vectors agree there. A fleet's items never each hold a fleet's bins.
        let mut allowed: BTreeMap<Vec<bool>, usize> = BTreeMap::new();
        let mut id = |bins: Vec<bool>| {
            let next = allowed.len();
            *allowed.entry(bins).or_insert(next)
        };
        // A kind's vector counts once an item has it (a kind no item has would part bins for nothing).
        let mut kind_bins: Vec<Option<usize>> = vec![None; instance.kinds.len()];
        let item_bins: Vec<usize> = instance
            .items
            .iter()
            .map(|item| match item.home {
                Some(home) if !instance.kinds[item.kind][home] => {
                    let mut bins = instance.kinds[item.kind].clone();
                    bins[home] = true;
                    id(bins)
                }
                _ => *kind_bins[item.kind]
                    .get_or_insert_with(|| id(instance.kinds[item.kind].clone())),
            })
            .collect();
        let mut columns = vec![Vec::new(); allowed.len()];
        for (bins, id) in allowed {
            columns[id] = bins;
        }
        // Bins of two machines are alike only where some item needs room on its machine (CPU cores,
        // memory): otherwise a fleet's GPUs of one size are one class, tried once, not one per machine.
        let machines_matter = instance
            .items
            .iter()
            .any(|i| i.needs.cpu_cores > 0 || i.needs.memory > 0);
        let bin_class = classes(instance.bins.len(), |b| {
            let bin = &instance.bins[b];
            let column: Vec<bool> = columns.iter().map(|bins| bins[b]).collect();
            (
                bin.room,
                bin.fixed,
                machines_matter.then_some(bin.machine),
                column,
            )
        });
        let key = |i: usize| {
            let item = &instance.items[i];
            (
                item.size,
                item.needs.cpu_cores,
                item.needs.memory,
                item_bins[i],
            )
        };
        let item_class = classes(instance.items.len(), key);
        let item_class_exact = classes(instance.items.len(), |i| {
            let item = &instance.items[i];
            (key(i), item.origin, item.restarts)
        });
        let mut order: Vec<usize> = (0..instance.items.len()).collect();
        order.sort_by_key(|&i| {
            (
                Reverse(instance.items[i].size),
                item_class[i],
                item_class_exact[i],
            )
        });
        let sizes = order.iter().map(|&i| instance.items[i].size).collect();
        let mut openable: Vec<usize> = (0..instance.bins.len())
            .filter(|&b| !instance.bins[b].fixed)
            .collect();
        openable.sort_by_key(|&b| Reverse(instance.bins[b].room));
        Search {
            instance,
            order,
            sizes,
            item_class,
            item_class_exact,
            bin_class,
            openable,
            budget,
            spent: 0,
        }
    }

    /// A packing into at most `target` bins with the fewest restarts found: attempts with doubling budgets
    /// (each after the first shuffling ties) until one finds a packing or proves there is none, then the rest
    /// of a share of the budget spent on fewer restarts.
    pub(super) fn at_most(&mut self, target: usize) -> Option<Packing> {
        let mut limit = (self.budget / 32).max(1_000);
        let mut found = None;
        for attempt in 0u64.. {
            let left = self.budget.saturating_sub(self.spent);
            if left == 0 {
                break;
            }
            let mut state = self.state(target, limit.min(left), true, attempt);
            let finished = self.dfs(&mut state);
            self.spent += state.steps;
            if let Some(best) = state.best {
                found = Some(best);
                break;
            }
            if finished && state.complete {
                return None; // proved: nothing fits in `target` bins
            }
            if attempt == 0 {
                let mut rng = 0x2545_F491_4F6C_DD1D;
                found = self
                    .repair(target, state.deepest_placed, false, &mut rng)
                    .map(|bins| (bins, 0));
                break;
            }
            limit = limit.saturating_mul(2);
        }
        let (bins, _) = found?;
        let mut best = self.relabel(&bins);
        let left = self.budget.saturating_sub(self.spent).min(self.budget / 16);
        let cost = self.instance.cost(&best.bins);
        if cost > 0 && left > 0 {
            let mut state = self.state(target, left, false, 0);
            state.best = Some((best.bins.clone(), cost));
            self.dfs(&mut state);
            self.spent += state.steps;
            if let Some((bins, found)) = state.best {
                if found < cost {
                    best = Packing {
                        used: self.instance.used(&bins),
                        restarts: self.instance.restarts(&bins),
                        bins,
                    };
                }
            }
        }
        Some(best)
    }

    fn state(&self, target: usize, limit: u64, first: bool, attempt: u64) -> State {
        let instance = self.instance;
        State {
            target,
            placed: vec![None; instance.items.len()],
            closed: vec![false; instance.bins.len()],
            machines: instance.machines.clone(),
            used: instance.bins.iter().filter(|b| b.fixed).count(),
            volume_left: self.sizes.iter().sum(),
            moves: 0,
            limit,
            steps: 0,
            first,
            rng: attempt.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            best: None,
            complete: true,
            deepest: 0,
            deepest_placed: Vec::new(),
            closed_count: 0,
        }
    }

    /// Fills the next bin. Returns false when the budget ran out (the search is then incomplete) or, when
    /// looking for the first packing, once one is found.
    ///
    /// Looking for the first packing, it counts bins only: interchangeable bins are tried once and each set
    /// leaves room for no other item (Korf's dominance), and [`Search::relabel`] then puts each set where it
    /// saves most restarts. Looking for fewer restarts, it tries every bin and every set that fills enough.
    fn dfs(&self, state: &mut State) -> bool {
        state.steps += 1;
        if state.steps > state.limit {
            return false;
        }
        let mut unplaced = (0..self.order.len()).filter(|&p| state.placed[self.order[p]].is_none());
        let Some(largest) = unplaced.next() else {
            let bins: Vec<usize> = state
                .placed
                .iter()
                .map(|b| b.expect("all placed"))
                .collect();
            let better = state.best.as_ref().is_none_or(|(_, m)| state.moves < *m);
            if better {
                state.best = Some((bins, state.moves));
            }
            return !state.first;
        };
        // Branch on the item, among the largest few, with the fewest ways to be placed: an item that fits
        // nowhere ends the branch at once, instead of after every choice that comes before it.
        let window: Vec<usize> = std::iter::once(largest)
            .chain(unplaced)
            .take(WINDOW)
            .collect();
        if state.closed_count > state.deepest || state.deepest_placed.is_empty() {
            state.deepest = state.closed_count;
            state.deepest_placed.clone_from(&state.placed);
        }
        let mut branches: Option<(Vec<(usize, Sets)>, usize)> = None;
        for pos in window {
            let fewest = branches.as_ref().map_or(usize::MAX, |(_, count)| *count);
            let found = self.branches(state, pos, fewest);
            if state.steps > state.limit {
                return false;
            }
            let Some(found) = found else {
                continue; // as many ways as the best so far, or more
            };
            let count = found.iter().map(|(_, sets)| sets.fills.len()).sum();
            if count == 0 {
                return true; // nothing can hold this item: a dead end, proved
            }
            branches = Some((found, count));
            if count == 1 {
                break;
            }
        }
        let (branches, _) = branches.expect("at least one unplaced item");
        for (b, sets) in branches {
            for fill in &sets.fills {
                if state
                    .best
                    .as_ref()
                    .is_some_and(|(_, m)| state.moves + fill.moves >= *m)
                {
                    continue;
                }
                let positions = &sets.positions[fill.start..fill.start + fill.len];
                self.apply(state, b, positions, fill, true);
                let go_on = self.dfs(state);
                self.apply(state, b, positions, fill, false);
                if !go_on {
                    return false;
                }
            }
        }
        true
    }

    /// The bins the item at `pos` may go to and the sets that could fill each with it, in the order to try.
    ///
    /// None once it has found `fewest` sets: another item has no more ways than this one.
    fn branches(&self, state: &mut State, pos: usize, fewest: usize) -> Option<Vec<(usize, Sets)>> {
        let item = &self.instance.items[self.order[pos]];
        let mut candidates: Vec<usize> = (0..self.instance.bins.len())
            .filter(|&b| {
                let bin = &self.instance.bins[b];
                !state.closed[b]
                    && self.instance.allows(item, b)
                    && item.size <= bin.room
                    && fits_machine(&state.machines[bin.machine], item.needs)
                    && (bin.fixed || state.used < state.target)
            })
            .collect();
        // Bins with fixed work first (they cost nothing), then the item's own class, then best fit.
        let own = self.bin_class[item.origin];
        candidates.sort_by_key(|&b| {
            let bin = &self.instance.bins[b];
            (
                !bin.fixed,
                self.bin_class[b] != own,
                bin.room,
                b != item.origin,
            )
        });
        let mut tried = Vec::new();
        let mut out = Vec::new();
        let mut count = 0;
        for b in candidates {
            if state.first {
                if tried.contains(&self.bin_class[b]) {
                    continue;
                }
                tried.push(self.bin_class[b]);
            }
            let mut sets = self.fills(state, pos, b, fewest - count)?;
            count += sets.fills.len();
            if state.first {
                shuffle_ties(&mut sets.fills, &mut state.rng);
            } else {
                sets.fills.sort_by_key(|f| (f.moves, Reverse(f.sum)));
            }
            if !sets.fills.is_empty() {
                out.push((b, sets));
            }
        }
        Some(out)
    }

    fn apply(&self, state: &mut State, b: usize, positions: &[usize], fill: &Fill, on: bool) {
        let bin = &self.instance.bins[b];
        let machine = &mut state.machines[bin.machine];
        for &p in positions {
            let needs = self.instance.items[self.order[p]].needs;
            if on {
                machine.cpu_cores -= needs.cpu_cores;
                machine.memory -= needs.memory;
            } else {
                machine.cpu_cores += needs.cpu_cores;
                machine.memory += needs.memory;
            }
            state.placed[self.order[p]] = on.then_some(b);
        }
        state.closed[b] = on;
        let opens = usize::from(!bin.fixed);
        if on {
            state.closed_count += 1;
            state.used += opens;
            state.volume_left -= fill.sum;
            state.moves += fill.moves;
        } else {
            state.closed_count -= 1;
            state.used -= opens;
            state.volume_left += fill.sum;
            state.moves -= fill.moves;
        }
    }

    /// The packing with the same sets per bin class, each set on the bin of its class where most of its
    /// restarts are saved (bins in use now before free ones).
    pub(super) fn relabel(&self, bins: &[usize]) -> Packing {
        let instance = self.instance;
        let mut sets: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, &b) in bins.iter().enumerate() {
            sets.entry(b).or_default().push(i);
        }
        let in_use: Vec<bool> = {
            let mut u: Vec<bool> = instance.bins.iter().map(|b| b.fixed).collect();
            for item in &instance.items {
                u[item.origin] = true;
            }
            u
        };
        let mut members: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for b in 0..instance.bins.len() {
            members.entry(self.bin_class[b]).or_default().push(b);
        }
        let mut filled: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &b in sets.keys() {
            filled.entry(self.bin_class[b]).or_default().push(b);
        }
        let mut out = bins.to_vec();
        for (class, filled) in filled {
            // Only a set's items' own bins save anything: those pairs first, most saved first (a class of
            // a fleet's GPUs would make sets × bins pairs of nothing saved).
            let mut pairs = Vec::new();
            for &f in &filled {
                let mut saved: BTreeMap<usize, u64> = BTreeMap::new();
                for &i in &sets[&f] {
                    let origin = instance.items[i].origin;
                    if self.bin_class[origin] == class {
                        *saved.entry(origin).or_default() += instance.items[i].cost();
                    }
                }
                pairs.extend(
                    saved
                        .into_iter()
                        .map(|(m, s)| (Reverse(s), !in_use[m], f, m)),
                );
            }
            pairs.sort();
            let mut bin_of: BTreeMap<usize, usize> = BTreeMap::new();
            let mut taken_bin = BTreeSet::new();
            for (_, _, f, m) in pairs {
                if bin_of.contains_key(&f) || taken_bin.contains(&m) {
                    continue;
                }
                bin_of.insert(f, m);
                taken_bin.insert(m);
            }
            // The rest, in order, on the bins left, those in use first.
            let mut left: Vec<usize> = members[&class]
                .iter()
                .copied()
                .filter(|m| !taken_bin.contains(m))
                .collect();
            left.sort_by_key(|&m| (!in_use[m], m));
            let mut left = left.into_iter();
            for &f in &filled {
                bin_of.entry(f).or_insert_with(|| {
                    left.next().expect("a class has a bin for each of its sets")
                });
            }
            for (f, m) in bin_of {
                for &i in &sets[&f] {
                    out[i] = m;
                }
            }
        }
        Packing {
            used: instance.used(&out),
            restarts: instance.restarts(&out),
            bins: out,
        }
    }
}

fn fits_machine(room: &Room, needs: Room) -> bool {
    needs.cpu_cores <= room.cpu_cores && needs.memory <= room.memory
}

/// Numbers things by key: equal keys, equal class.
fn classes<K: Ord>(n: usize, key: impl Fn(usize) -> K) -> Vec<usize> {
    let mut seen = BTreeMap::new();
    (0..n)
        .map(|x| {
            let next = seen.len();
            *seen.entry(key(x)).or_insert(next)
        })
        .collect()
}

fn xorshift(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}
