//! A generator of fleets with a known optimum, for the repack's tests, the benchmarks and the browser's wasm
//! bench: no part of a repack, so it stays out of the search's way.

use super::{Bin, Instance, Item, Room};

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
                kind: 0,
                home: Some(origin),
            })
            .collect(),
        kinds: vec![vec![true; rooms.len()]],
    }
}
