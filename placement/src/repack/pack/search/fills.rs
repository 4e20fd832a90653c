//! Listing the sets that fill one bin around its largest unplaced item (Korf's dominance: each leaves room
//! for no other item), the innermost loop of the search and where its steps are spent.

use super::{fits_machine, xorshift, Room, Search, State, MAX_FILLS};
use std::cmp::Reverse;

impl Search<'_> {
    /// Every set that fills bin `b` with the item at `pos` and others, leaving room for no other
    /// unplaced item, and filling enough that what is left still fits the bins the target allows.
    ///
    /// None once it has found `cap` sets.
    pub(super) fn fills(
        &self,
        state: &mut State,
        pos: usize,
        b: usize,
        cap: usize,
    ) -> Option<Sets> {
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
                || !self.instance.allows(item, walk.b)
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
                && self.instance.allows(item, walk.b)
                && fits_machine(&machine, item.needs)
        })
    }
}

/// Sets that fill one bin, their items' positions side by side in one vector.
#[derive(Default)]
pub(super) struct Sets {
    pub(super) fills: Vec<Fill>,
    pub(super) positions: Vec<usize>,
}

pub(super) struct Fill {
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) sum: u64,
    pub(super) moves: u64,
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

/// Fullest sets first, fewer restarts next; ties in a random order that changes with each attempt (the
/// first attempt keeps them as found).
pub(super) fn shuffle_ties(fills: &mut [Fill], rng: &mut u64) {
    if *rng != 0 {
        for i in (1..fills.len()).rev() {
            fills.swap(i, (xorshift(rng) % (i as u64 + 1)) as usize);
        }
    }
    fills.sort_by_key(|f| (Reverse(f.sum), f.moves));
}
