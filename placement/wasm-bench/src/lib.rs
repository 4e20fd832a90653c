//! The repack planner built for the browser's wasm (with the size-tuned settings of the console's bundle), for
//! `scripts/bench-repack` to time under node (V8, the
//! engine of Chromium): each export builds a triplet instance and returns the GPUs the packing uses.

use placement::repack::{first_fit_decreasing, pack, triplets, Goal, BUDGET};

/// GPUs the planner ends with on `triplets(bins, seed)`.
#[no_mangle]
pub extern "C" fn planner(bins: u32, seed: u32) -> u32 {
    let instance = triplets(bins as usize, u64::from(seed));
    pack(&instance, Goal::Most, BUDGET).map_or(0, |p| p.used as u32)
}

/// GPUs first fit decreasing ends with on `triplets(bins, seed)`.
#[no_mangle]
pub extern "C" fn ffd(bins: u32, seed: u32) -> u32 {
    let instance = triplets(bins as usize, u64::from(seed));
    first_fit_decreasing(&instance).map_or(0, |p| p.used as u32)
}

/// Only the time to build the instance, to subtract.
#[no_mangle]
pub extern "C" fn build(bins: u32, seed: u32) -> u32 {
    triplets(bins as usize, u64::from(seed)).items.len() as u32
}
