//! Emptying GPUs one at a time, the cheapest to empty first: what a repack of a large fleet falls back on
//! when the search runs out of budget. It moves only what the GPUs it frees held, so its restarts are
//! theirs alone, where a packing from scratch (first fit decreasing) moves nearly everything.

use super::{Goal, Instance, Packing, Room};
use std::collections::BTreeSet;

/// How many GPUs with room, fullest first, are weighed for one item before it is taken to fit nowhere: the
/// first usually takes it (the items alike share a kind), and a fleet's worth of scans would make a
/// preview of 10,000 GPUs slow.
const WEIGHED: usize = 64;

/// Frees GPUs in use one at a time, those whose work costs least to move first (its restarts, then its
/// memory): each of its items goes to the fullest other GPU in use that takes it (best fit), and the GPU is
/// freed only where every one of its items found a place. A GPU that took work is not emptied after. Stops
/// once `goal`'s number are free.
pub fn evacuate(instance: &Instance, goal: Goal) -> Packing {
    let mut bins: Vec<usize> = instance.items.iter().map(|i| i.origin).collect();
    let mut held: Vec<Vec<usize>> = vec![Vec::new(); instance.bins.len()];
    let mut room: Vec<u64> = instance.bins.iter().map(|b| b.room).collect();
    let mut machines = instance.machines.clone();
    for (i, item) in instance.items.iter().enumerate() {
        held[item.origin].push(i);
        room[item.origin] = room[item.origin].saturating_sub(item.size);
        let m = &mut machines[instance.bins[item.origin].machine];
        m.cpu_cores = m.cpu_cores.saturating_sub(item.needs.cpu_cores);
        m.memory = m.memory.saturating_sub(item.needs.memory);
    }
    let in_use = |b: usize| instance.bins[b].fixed || !held[b].is_empty();
    // The GPUs in use, by room: where an item may go.
    let mut by_room: BTreeSet<(u64, usize)> = (0..instance.bins.len())
        .filter(|&b| in_use(b))
        .map(|b| (room[b], b))
        .collect();
    let mut candidates: Vec<usize> = (0..instance.bins.len())
        .filter(|&b| !instance.bins[b].fixed && !held[b].is_empty())
        .collect();
    candidates.sort_by_key(|&b| {
        let items = &held[b];
        let cost: u64 = items.iter().map(|&i| instance.items[i].cost()).sum();
        (cost, b)
    });
    let wanted = match goal {
        Goal::Most => usize::MAX,
        Goal::Free(n) => n,
    };
    let mut took = vec![false; instance.bins.len()];
    let mut freed = 0;
    for from in candidates {
        if freed == wanted {
            break;
        }
        if took[from] {
            continue;
        }
        by_room.remove(&(room[from], from));
        let mut items = held[from].clone();
        items.sort_by_key(|&i| std::cmp::Reverse(instance.items[i].size));
        let mut placed: Vec<(usize, usize)> = Vec::new();
        for &i in &items {
            let item = &instance.items[i];
            let origin_machine = instance.bins[from].machine;
            let to = by_room
                .range((item.size, 0)..)
                .take(WEIGHED)
                .map(|&(_, b)| b)
                .find(|&b| {
                    let machine = instance.bins[b].machine;
                    instance.allows(item, b)
                        && (machine == origin_machine
                            || (item.needs.cpu_cores <= machines[machine].cpu_cores
                                && item.needs.memory <= machines[machine].memory))
                });
            let Some(to) = to else { break };
            shift(&mut by_room, &mut room, to, |r| r - item.size);
            carry(
                &mut machines,
                item.needs,
                origin_machine,
                instance.bins[to].machine,
            );
            placed.push((i, to));
        }
        if placed.len() == items.len() {
            for (i, to) in placed {
                bins[i] = to;
                held[to].push(i);
                took[to] = true;
            }
            held[from].clear();
            freed += 1;
            continue;
        }
        // Not every item found a place: what was placed goes back.
        for (i, to) in placed {
            let item = &instance.items[i];
            shift(&mut by_room, &mut room, to, |r| r + item.size);
            carry(
                &mut machines,
                item.needs,
                instance.bins[to].machine,
                instance.bins[from].machine,
            );
        }
        by_room.insert((room[from], from));
    }
    Packing {
        used: instance.used(&bins),
        restarts: instance.restarts(&bins),
        bins,
    }
}

/// Changes the room of bin `b` by `f`, keeping the index by room.
fn shift(by_room: &mut BTreeSet<(u64, usize)>, room: &mut [u64], b: usize, f: impl Fn(u64) -> u64) {
    by_room.remove(&(room[b], b));
    room[b] = f(room[b]);
    by_room.insert((room[b], b));
}

/// Moves what an item `needs` from machine `from` to machine `to`: `from` has that much more room, `to` that
/// much less (the same machine, nothing).
fn carry(machines: &mut [Room], needs: Room, from: usize, to: usize) {
    if from != to {
        machines[to].cpu_cores -= needs.cpu_cores;
        machines[to].memory -= needs.memory;
        machines[from].cpu_cores += needs.cpu_cores;
        machines[from].memory += needs.memory;
    }
}
