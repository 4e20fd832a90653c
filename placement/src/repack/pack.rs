//! The packing search behind a repack: bin completion (Korf's), filling one GPU at a time with the largest
//! unplaced item and a set of others that leaves no room for any more, under a bound that no plan needs more
//! GPUs than the target. No names here: items and bins are indices, so the browser's wasm runs it fast.

use std::cmp::Reverse;
use std::collections::BTreeMap;

/// A GPU the repack may fill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bin {
    /// Room for movable work: what the GPU offers less what stays on it.
    pub room: u64,
    /// Index of its machine in [`Instance::machines`].
    pub machine: usize,
    /// Work that cannot move stays on it, so it is in use whatever the repack does.
    pub fixed: bool,
}

/// What a machine has left for movable work: CPU cores and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// CPU cores.
    pub cpu_cores: u32,
    /// Memory, in bytes.
    pub memory: u64,
}

/// Work that moves as one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// GPU memory it takes, in bytes.
    pub size: u64,
    /// CPU cores and memory it holds on its machine.
    pub needs: Room,
    /// The bin it is in now.
    pub origin: usize,
    /// Workers that restart when it moves.
    pub restarts: usize,
    /// The bins it may go to (its request's ids, models, vendor, health; a group's GPU size).
    pub allowed: Vec<bool>,
}

/// A fleet as the search sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Instance {
    /// GPUs.
    pub bins: Vec<Bin>,
    /// Machines.
    pub machines: Vec<Room>,
    /// Movable work.
    pub items: Vec<Item>,
}

/// What the repack asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Goal {
    /// Free as many GPUs as it can.
    Most,
    /// Free this many.
    Free(usize),
}

impl Goal {
    /// The goal of freeing `free` GPUs, or as many as can be when not said; none is no goal.
    pub fn from_free(free: Option<usize>) -> Result<Goal, super::RepackError> {
        match free {
            None => Ok(Goal::Most),
            Some(0) => Err(super::RepackError::FreeNone),
            Some(n) => Ok(Goal::Free(n)),
        }
    }
}

/// A packing the search found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packing {
    /// The bin of each item.
    pub bins: Vec<usize>,
    /// Bins in use: with fixed work or with an item.
    pub used: usize,
    /// Workers that restart: those of items not in their origin bin.
    pub restarts: usize,
}

/// Why the search returns no packing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// By memory alone no packing frees that many: `most` is the most any could.
    Impossible {
        /// The most that any packing could free, by volume.
        most: usize,
    },
    /// The search ran out of budget before finding one.
    NotFound,
}

impl Item {
    /// What moving it costs: its restarts, and between equal restarts the memory that must load again.
    fn cost(&self) -> u64 {
        ((self.restarts as u64) << 44) | (self.size >> 10).min((1 << 44) - 1)
    }
}

impl Instance {
    /// Bins in use now.
    pub fn used_now(&self) -> usize {
        self.used_by(|i| self.items[i].origin)
    }

    /// Bins in use under `packing`.
    pub fn used(&self, bins: &[usize]) -> usize {
        self.used_by(|i| bins[i])
    }

    fn used_by(&self, bin_of: impl Fn(usize) -> usize) -> usize {
        let mut used: Vec<bool> = self.bins.iter().map(|b| b.fixed).collect();
        for i in 0..self.items.len() {
            used[bin_of(i)] = true;
        }
        used.into_iter().filter(|&u| u).count()
    }

    /// The fewest bins any packing can use, by volume: fixed bins, then the roomiest until everything fits.
    pub fn lower_bound(&self) -> usize {
        let volume: u64 = self.items.iter().map(|i| i.size).sum();
        let fixed_room: u64 = self.bins.iter().filter(|b| b.fixed).map(|b| b.room).sum();
        let fixed = self.bins.iter().filter(|b| b.fixed).count();
        let mut rooms: Vec<u64> = self
            .bins
            .iter()
            .filter(|b| !b.fixed)
            .map(|b| b.room)
            .collect();
        rooms.sort_unstable_by_key(|&r| Reverse(r));
        let mut have = fixed_room;
        let mut extra = 0;
        for room in rooms {
            if have >= volume {
                break;
            }
            have += room;
            extra += 1;
        }
        fixed + extra
    }

    /// Whether `bins` puts every item where it is allowed, and no bin or machine past its room.
    pub fn fits(&self, bins: &[usize]) -> bool {
        let mut room: Vec<u64> = self.bins.iter().map(|b| b.room).collect();
        let mut machines = self.machines.clone();
        for (item, &b) in self.items.iter().zip(bins) {
            let m = &mut machines[self.bins[b].machine];
            if !item.allowed[b]
                || item.size > room[b]
                || item.needs.cpu_cores > m.cpu_cores
                || item.needs.memory > m.memory
            {
                return false;
            }
            room[b] -= item.size;
            m.cpu_cores -= item.needs.cpu_cores;
            m.memory -= item.needs.memory;
        }
        bins.len() == self.items.len()
    }

    fn cost(&self, bins: &[usize]) -> u64 {
        self.items
            .iter()
            .zip(bins)
            .filter(|(item, &b)| item.origin != b)
            .map(|(item, _)| item.cost())
            .sum()
    }

    fn restarts(&self, bins: &[usize]) -> usize {
        self.items
            .iter()
            .zip(bins)
            .filter(|(item, &b)| item.origin != b)
            .map(|(item, _)| item.restarts)
            .sum()
    }
}

/// First fit decreasing, the textbook heuristic, for comparison: each item, largest first, into the first bin
/// (in index order) it fits. None when some item fits nowhere.
pub fn first_fit_decreasing(instance: &Instance) -> Option<Packing> {
    let mut order: Vec<usize> = (0..instance.items.len()).collect();
    order.sort_by_key(|&i| Reverse(instance.items[i].size));
    let mut room: Vec<u64> = instance.bins.iter().map(|b| b.room).collect();
    let mut machines = instance.machines.clone();
    let mut bins = vec![0; instance.items.len()];
    for i in order {
        let item = &instance.items[i];
        let b = (0..room.len()).find(|&b| {
            let m = &machines[instance.bins[b].machine];
            item.allowed[b]
                && item.size <= room[b]
                && item.needs.cpu_cores <= m.cpu_cores
                && item.needs.memory <= m.memory
        })?;
        room[b] -= item.size;
        let m = &mut machines[instance.bins[b].machine];
        m.cpu_cores -= item.needs.cpu_cores;
        m.memory -= item.needs.memory;
        bins[i] = b;
    }
    Some(Packing {
        used: instance.used(&bins),
        restarts: instance.restarts(&bins),
        bins,
    })
}

/// The packing that frees the most bins (or `goal`'s number) with the fewest restarts the search finds within
/// `budget` steps. With [`Goal::Most`] it never does worse than leaving everything where it is.
pub fn pack(instance: &Instance, goal: Goal, budget: u64) -> Result<Packing, Shortfall> {
    let now = instance.used_now();
    let lower = instance.lower_bound();
    let stay = Packing {
        bins: instance.items.iter().map(|i| i.origin).collect(),
        used: now,
        restarts: 0,
    };
    // First fit decreasing is instant and often close: a packing known to exist, and the search's fallback.
    let ffd = first_fit_decreasing(instance).filter(|p| p.used < now);
    let upper = ffd.as_ref().map_or(now, |p| p.used);
    let targets = match goal {
        Goal::Free(0) => return Ok(stay),
        Goal::Free(n) => {
            let target = now.checked_sub(n).filter(|&t| t >= lower);
            let Some(target) = target else {
                return Err(Shortfall::Impossible {
                    most: now.saturating_sub(lower),
                });
            };
            target..target + 1
        }
        Goal::Most => lower..upper + 1,
    };
    let mut search = Search::new(instance, budget);
    let last = targets.end - 1;
    for target in targets {
        // Targets below the known packing may take three quarters of the budget; the rest finds that one
        // again with fewer restarts.
        search.budget = if target < upper {
            budget / 4 * 3
        } else {
            budget
        };
        if let Some(found) = search.at_most(target) {
            return Ok(found);
        }
        if target == last || search.spent >= budget {
            break;
        }
    }
    match (goal, ffd) {
        (Goal::Most, Some(ffd)) => Ok(search.relabel(&ffd.bins)),
        (Goal::Most, None) => Ok(stay),
        (Goal::Free(n), Some(ffd)) if ffd.used + n <= now => Ok(search.relabel(&ffd.bins)),
        (Goal::Free(_), _) => Err(Shortfall::NotFound),
    }
}

struct Search<'a> {
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
    budget: u64,
    spent: u64,
}

/// One attempt's state.
struct State {
    target: usize,
    placed: Vec<Option<usize>>,
    closed: Vec<bool>,
    machines: Vec<Room>,
    used: usize,
    volume_left: u64,
    /// What the moves so far cost ([`Item::cost`]).
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

/// The steps one repair may take: a few bins' items, packed again.
const REPAIR_LIMIT: u64 = 20_000;

/// How many of the largest unplaced items are weighed for the one with the fewest ways to be placed.
const WINDOW: usize = 12;

impl<'a> Search<'a> {
    fn new(instance: &'a Instance, budget: u64) -> Search<'a> {
        let bin_class = classes(instance.bins.len(), |b| {
            let bin = &instance.bins[b];
            let column: Vec<bool> = instance.items.iter().map(|i| i.allowed[b]).collect();
            (bin.room, bin.fixed, bin.machine, column)
        });
        let key = |i: usize| {
            let item = &instance.items[i];
            (
                item.size,
                item.needs.cpu_cores,
                item.needs.memory,
                item.allowed.clone(),
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
    fn at_most(&mut self, target: usize) -> Option<Packing> {
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
                    .repair(target, state.deepest_placed, &mut rng)
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

    /// Large neighbourhood search from the partial packing a dive left: empty a few of its bins at random and
    /// pack their items and the unplaced ones again, keeping the result when it leaves no more volume
    /// unplaced; until everything is placed or the budget is spent. A dive that goes wrong early cannot be
    /// mended by backtracking near the leaves; this mends it where it went wrong.
    fn repair(
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
                        Item {
                            // Restarts are not weighed while bins are counted: any bin of the part will do.
                            origin: sub_bins.iter().position(|&b| b == item.origin).unwrap_or(0),
                            allowed: sub_bins.iter().map(|&b| item.allowed[b]).collect(),
                            ..item.clone()
                        }
                    })
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
                    && item.allowed[b]
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

    /// Every set that fills bin `b` with the item at `pos` and others, leaving room for no other
    /// unplaced item, and filling enough that what is left still fits the bins the target allows.
    ///
    /// None once it has found `cap` sets.
    fn fills(&self, state: &mut State, pos: usize, b: usize, cap: usize) -> Option<Sets> {
        let bin = &self.instance.bins[b];
        let used_after = state.used + usize::from(!bin.fixed);
        let future: u64 = (0..self.instance.bins.len())
            .filter(|&o| o != b && !state.closed[o] && self.instance.bins[o].fixed)
            .map(|o| self.instance.bins[o].room)
            .chain(
                self.openable
                    .iter()
                    .filter(|&&o| o != b && !state.closed[o])
                    .take(state.target.saturating_sub(used_after))
                    .map(|&o| self.instance.bins[o].room),
            )
            .sum();
        let need = state.volume_left.saturating_sub(future);
        let first = &self.instance.items[self.order[pos]];
        let mut machine = state.machines[bin.machine];
        machine.cpu_cores -= first.needs.cpu_cores;
        machine.memory -= first.needs.memory;
        let smallest = (0..self.order.len())
            .rev()
            .find(|&p| p != pos && state.placed[self.order[p]].is_none())
            .map_or(u64::MAX, |p| self.sizes[p]);
        let mut out = Sets::default();
        let mut chosen = vec![pos];
        let mut walk = Walk {
            cap,
            b,
            anchor: pos,
            need,
            smallest,
            out: &mut out,
            chosen: &mut chosen,
        };
        self.walk(
            state,
            &mut walk,
            0,
            first.size,
            bin.room - first.size,
            machine,
        );
        (out.fills.len() < cap).then_some(out)
    }

    fn walk(
        &self,
        state: &mut State,
        walk: &mut Walk,
        from: usize,
        sum: u64,
        room: u64,
        machine: Room,
    ) {
        state.steps += 1;
        if state.steps > state.limit {
            return;
        }
        if walk.out.fills.len() >= walk.cap {
            return;
        }
        if walk.out.fills.len() >= MAX_FILLS {
            state.complete = false;
            return;
        }
        if sum >= walk.need && (!state.first || self.maximal(state, walk, room, machine)) {
            // Restarts as the set stands; counting bins only, none for a set in a bin of its item's class
            // (the relabel may put it back), so a bound from below.
            let moves = walk
                .chosen
                .iter()
                .map(|&p| {
                    let item = &self.instance.items[self.order[p]];
                    let stays = if state.first {
                        self.bin_class[item.origin] == self.bin_class[walk.b]
                    } else {
                        item.origin == walk.b
                    };
                    if stays {
                        0
                    } else {
                        item.cost()
                    }
                })
                .sum();
            walk.out.fills.push(Fill {
                start: walk.out.positions.len(),
                len: walk.chosen.len(),
                sum,
                moves,
            });
            walk.out.positions.extend_from_slice(walk.chosen);
        }
        // Only items that fit the room; the sizes run largest first.
        let mut p = from + self.sizes[from..].partition_point(|&s| s > room);
        let class = if state.first {
            &self.item_class
        } else {
            &self.item_class_exact
        };
        let mut last_class = None;
        while p < self.order.len() {
            let i = self.order[p];
            let item = &self.instance.items[i];
            if p == walk.anchor
                || state.placed[i].is_some()
                || !item.allowed[walk.b]
                || last_class == Some(class[i])
                || !fits_machine(&machine, item.needs)
            {
                p += 1;
                continue;
            }
            if sum + item.size < walk.need && room - item.size < walk.smallest {
                // This item would be the last and falls short, as would every item down to the size that
                // leaves room for one more: skip to there.
                let limit = room.saturating_sub(walk.smallest);
                let next = p + self.sizes[p..].partition_point(|&s| s > limit);
                p = next.max(p + 1);
                continue;
            }
            last_class = Some(class[i]);
            walk.chosen.push(p);
            let after = Room {
                cpu_cores: machine.cpu_cores - item.needs.cpu_cores,
                memory: machine.memory - item.needs.memory,
            };
            self.walk(state, walk, p + 1, sum + item.size, room - item.size, after);
            walk.chosen.pop();
            p += 1;
        }
    }

    /// Whether no unplaced item outside the set fits what the set leaves of the bin and machine.
    fn maximal(&self, state: &State, walk: &Walk, room: u64, machine: Room) -> bool {
        if room < walk.smallest {
            return true;
        }
        let start = self.sizes.partition_point(|&s| s > room);
        !(start..self.order.len()).any(|p| {
            let item = &self.instance.items[self.order[p]];
            state.placed[self.order[p]].is_none()
                && !walk.chosen.contains(&p)
                && item.allowed[walk.b]
                && fits_machine(&machine, item.needs)
        })
    }

    /// The packing with the same sets per bin class, each set on the bin of its class where most of its
    /// restarts are saved (bins in use now before free ones).
    fn relabel(&self, bins: &[usize]) -> Packing {
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
        let mut by_class: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &b in sets.keys() {
            by_class.entry(self.bin_class[b]).or_default().push(b);
        }
        let mut out = bins.to_vec();
        for (class, filled) in by_class {
            let members: Vec<usize> = (0..instance.bins.len())
                .filter(|&b| self.bin_class[b] == class)
                .collect();
            let mut pairs = Vec::new();
            for &f in &filled {
                for &m in &members {
                    let saved: u64 = sets[&f]
                        .iter()
                        .filter(|&&i| instance.items[i].origin == m)
                        .map(|&i| instance.items[i].cost())
                        .sum();
                    pairs.push((Reverse(saved), !in_use[m], f, m));
                }
            }
            pairs.sort();
            let mut taken_set = Vec::new();
            let mut taken_bin = Vec::new();
            for (_, _, f, m) in pairs {
                if taken_set.contains(&f) || taken_bin.contains(&m) {
                    continue;
                }
                taken_set.push(f);
                taken_bin.push(m);
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

/// Sets that fill one bin, their items' positions side by side in one vector.
#[derive(Default)]
struct Sets {
    fills: Vec<Fill>,
    positions: Vec<usize>,
}

struct Fill {
    start: usize,
    len: usize,
    sum: u64,
    moves: u64,
}

struct Walk<'o> {
    /// Stop at this many sets.
    cap: usize,
    b: usize,
    /// The item the set is built around.
    anchor: usize,
    need: u64,
    smallest: u64,
    out: &'o mut Sets,
    chosen: &'o mut Vec<usize>,
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

/// Fullest sets first, fewer restarts next; ties in a random order that changes with each attempt (the
/// first attempt keeps them as found).
fn shuffle_ties(fills: &mut [Fill], rng: &mut u64) {
    if *rng != 0 {
        for i in (1..fills.len()).rev() {
            fills.swap(i, (xorshift(rng) % (i as u64 + 1)) as usize);
        }
    }
    fills.sort_by_key(|f| (Reverse(f.sum), f.moves));
}

fn xorshift(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

/// A bin-packing instance with a known optimum, in the manner of Falkenauer's triplets: `bins` bins of 1000,
/// each filled exactly by three items in [250, 500), so no packing uses fewer than `bins` and one uses that
/// many. The items start where first fit put them in a shuffled order, as work that came and went would,
/// and a few GPUs stand empty.
pub fn triplets(bins: usize, seed: u64) -> Instance {
    const CAPACITY: u64 = 1000;
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = |below: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % below
    };
    let mut sizes = Vec::with_capacity(bins * 3);
    for _ in 0..bins {
        let a = 380 + next(111);
        let b = 250 + next(CAPACITY - a - 500 + 1);
        sizes.extend([a, b, CAPACITY - a - b]);
    }
    for i in (1..sizes.len()).rev() {
        sizes.swap(i, next(i as u64 + 1) as usize);
    }
    let mut rooms: Vec<u64> = Vec::new();
    let origins: Vec<usize> = sizes
        .iter()
        .map(|&size| {
            let b = rooms.iter().position(|&r| r >= size).unwrap_or_else(|| {
                rooms.push(CAPACITY);
                rooms.len() - 1
            });
            rooms[b] -= size;
            b
        })
        .collect();
    // Spare empty GPUs, as a fleet has: first fit decreasing may need more than first fit did.
    rooms.resize(rooms.len() + bins / 10 + 1, CAPACITY);
    let room = Room {
        cpu_cores: u32::MAX,
        memory: u64::MAX,
    };
    Instance {
        bins: vec![
            Bin {
                room: CAPACITY,
                machine: 0,
                fixed: false,
            };
            rooms.len()
        ],
        machines: vec![room],
        items: sizes
            .into_iter()
            .zip(origins)
            .map(|(size, origin)| Item {
                size,
                needs: Room {
                    cpu_cores: 0,
                    memory: 0,
                },
                origin,
                restarts: 1,
                allowed: vec![true; rooms.len()],
            })
            .collect(),
    }
}
