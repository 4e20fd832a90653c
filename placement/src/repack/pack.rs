//! The packing search behind a repack: bin completion (Korf's), filling one GPU at a time with the largest
//! unplaced item and a set of others that leaves no room for any more, under a bound that no plan needs more
//! GPUs than the target. No names here: items and bins are indices, so the browser's wasm runs it fast.

mod evacuate;
mod search;
mod triplets;

pub use evacuate::evacuate;
pub use triplets::triplets;

use search::Search;
use std::cmp::Reverse;

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
    /// Its kind, an index into [`Instance::kinds`]: the bins it may go to.
    pub kind: usize,
    /// The bin it may stay in whatever its kind allows (where it is now), when that bin is among these.
    pub home: Option<usize>,
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
    /// The bins each kind of item may go to (its request's ids, models, vendor, health; a group's GPU
    /// size): items alike share one, so that a fleet's items do not each carry a fleet's bins.
    pub kinds: Vec<Vec<bool>>,
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

    /// Whether `item` may go to bin `b`.
    pub fn allows(&self, item: &Item, b: usize) -> bool {
        item.home == Some(b) || self.kinds[item.kind][b]
    }

    /// Whether `bins` puts every item where it is allowed, and no bin or machine past its room.
    pub fn fits(&self, bins: &[usize]) -> bool {
        let mut room: Vec<u64> = self.bins.iter().map(|b| b.room).collect();
        let mut machines = self.machines.clone();
        for (item, &b) in self.items.iter().zip(bins) {
            let m = &mut machines[self.bins[b].machine];
            if !self.allows(item, b)
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
            instance.allows(item, b)
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
    // Asked for a number, half the budget goes to freeing that many from the fleet as it is.
    let mended = match goal {
        Goal::Free(n) => {
            search.budget = budget / 2;
            search.free_from_now(n)
        }
        Goal::Most => None,
    };
    let last = targets.end - 1;
    let mut searched = None;
    for target in targets {
        // Targets below the known packing may take three quarters of the budget; the rest finds that one
        // again with fewer restarts.
        search.budget = if target < upper {
            budget / 4 * 3
        } else {
            budget
        };
        searched = search.at_most(target);
        if searched.is_some() || target == last || search.spent >= budget {
            break;
        }
    }
    // The search fills GPUs as full as they go, whatever number was asked, and on a large fleet its budget
    // rarely lets it undo that: asked to free 3, it may free 75 and restart hundreds. Freeing GPUs from the
    // fleet as it is moves only what they held and what made room for it. The plan is the best of these for
    // the goal (the most GPUs freed, or enough, then the fewest restarts); first fit decreasing is the last
    // resort.
    let found = [
        mended,
        searched,
        ffd.map(|p| search.relabel(&p.bins)),
        Some(evacuate(instance, goal)),
    ]
    .into_iter()
    .flatten();
    match goal {
        Goal::Most => Ok(found
            .filter(|p| p.used < now)
            .min_by_key(|p| (p.used, p.restarts))
            .unwrap_or(stay)),
        Goal::Free(n) => found
            .filter(|p| p.used + n <= now)
            .min_by_key(|p| (p.restarts, p.used))
            .ok_or(Shortfall::NotFound),
    }
}
