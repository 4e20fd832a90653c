//! Repacking the fleet (seed 001: "the quality of the packing directly determines how much of the spare
//! capacity is actually realised versus left stranded in unusable fragments"). Online best fit leaves
//! fragments as work comes and goes; a repack moves shared work between GPUs so that whole GPUs come free,
//! with the fewest restarts, in an order that never puts a GPU over what it offers.

mod pack;

pub use pack::{
    first_fit_decreasing, pack, triplets, Bin, Goal, Instance, Item, Packing, Room, Shortfall,
};

use crate::inventory::{GpuRef, Inventory};
use crate::request::GpuDemand;
use crate::schedule::{Assignment, Hold, Scheduler};
use crate::sharing::{Sharing, MPS_MAX_CLIENTS};
use crate::units::{BasisPoints, Bytes};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The search steps a repack plan may take: about 100 ms in the browser's wasm on the largest fleets
/// measured (`placement/benches/repack.rs`, `scripts/bench-repack`). Steps, not time: wasm has no clock to
/// stop on, and the same steps give the same plan in the browser and on the server.
pub const BUDGET: u64 = 750_000;

/// Work a repack may move, as one: a shared worker, or the members of a sharing group on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Movable {
    /// How the console names it: the worker, or the group.
    pub name: String,
    /// The placed workers that move together, all sharing one GPU.
    pub workers: Vec<String>,
    /// The GPUs its request allows (ids, models, vendor, health); count and mode are not read.
    pub demand: GpuDemand,
    /// Only to a GPU of the same size: a group's shares are of one GPU's memory.
    pub same_size: bool,
}

/// One unit moved from one GPU to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    /// The unit.
    pub unit: String,
    /// Its workers, each of which restarts.
    pub workers: Vec<String>,
    /// Where it runs now.
    pub from: GpuRef,
    /// Where it runs after.
    pub to: GpuRef,
    /// GPU memory it takes.
    pub memory: Bytes,
}

/// One step of carrying a repack out. On the wire, `action` (`stop` or `start`), `unit` and `gpu`, beside
/// the deprecated `{"Stop": {"unit", "gpu"}}` / `{"Start": …}` key, kept one release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "RepackStepWire", try_from = "RepackStepIn")]
pub enum RepackStep {
    /// Stop the unit's workers on this GPU and wait until their memory is free.
    Stop {
        /// The unit.
        unit: String,
        /// The GPU it leaves.
        gpu: GpuRef,
    },
    /// Start the unit's workers on this GPU.
    Start {
        /// The unit.
        unit: String,
        /// The GPU it comes to.
        gpu: GpuRef,
    },
}

/// A step's unit and GPU, as the deprecated key held them.
#[derive(Clone, Serialize, Deserialize)]
struct UnitOnGpu {
    unit: String,
    gpu: GpuRef,
}

/// How a [`RepackStep`] is written.
#[derive(Serialize)]
struct RepackStepWire {
    #[serde(rename = "Stop", skip_serializing_if = "Option::is_none")]
    old_stop: Option<UnitOnGpu>,
    #[serde(rename = "Start", skip_serializing_if = "Option::is_none")]
    old_start: Option<UnitOnGpu>,
    action: &'static str,
    unit: String,
    gpu: GpuRef,
}

impl From<RepackStep> for RepackStepWire {
    fn from(step: RepackStep) -> RepackStepWire {
        let (action, unit, gpu) = match step {
            RepackStep::Stop { unit, gpu } => ("stop", unit, gpu),
            RepackStep::Start { unit, gpu } => ("start", unit, gpu),
        };
        let old = Some(UnitOnGpu {
            unit: unit.clone(),
            gpu: gpu.clone(),
        });
        RepackStepWire {
            old_stop: if action == "stop" { old.clone() } else { None },
            old_start: if action == "start" { old } else { None },
            action,
            unit,
            gpu,
        }
    }
}

/// A [`RepackStep`] as read back, from its old key or its new fields.
#[derive(Deserialize)]
struct RepackStepIn {
    #[serde(rename = "Stop")]
    old_stop: Option<UnitOnGpu>,
    #[serde(rename = "Start")]
    old_start: Option<UnitOnGpu>,
}

impl TryFrom<RepackStepIn> for RepackStep {
    type Error = &'static str;
    fn try_from(step: RepackStepIn) -> Result<RepackStep, &'static str> {
        match (step.old_stop, step.old_start) {
            (Some(UnitOnGpu { unit, gpu }), None) => Ok(RepackStep::Stop { unit, gpu }),
            (None, Some(UnitOnGpu { unit, gpu })) => Ok(RepackStep::Start { unit, gpu }),
            _ => Err("a repack step is either Stop or Start"),
        }
    }
}

/// A GPU's load before or after a repack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLoad {
    /// The GPU.
    pub gpu: GpuRef,
    /// What it offers.
    pub offered: Bytes,
    /// What shared work takes of it.
    pub taken: Bytes,
    /// The units and fixed workers on it, by name.
    pub sharers: Vec<String>,
}

/// What a repack would do, shown before anything changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepackPlan {
    /// Each move.
    pub moves: Vec<Move>,
    /// Workers that restart.
    pub restarts: usize,
    /// GPUs in use now that the repack leaves free.
    pub freed: Vec<GpuRef>,
    /// GPUs free now that the repack puts work on (a larger GPU that takes what two smaller ones held).
    pub filled: Vec<GpuRef>,
    /// By memory alone, the most GPUs any repack could free.
    pub most: usize,
    /// Stops and starts in an order that keeps every GPU within what it offers at each step.
    pub steps: Vec<RepackStep>,
    /// The shareable GPUs now.
    pub before: Vec<GpuLoad>,
    /// The shareable GPUs after.
    pub after: Vec<GpuLoad>,
}

/// A repack that cannot be planned as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepackError {
    /// A unit names a worker that is not placed.
    #[error("{unit} names {worker}, which is not placed")]
    UnknownWorker {
        /// The unit.
        unit: String,
        /// The worker.
        worker: String,
    },
    /// A worker that holds whole GPUs, several GPUs, or GPUs of a machine whose containers see them all.
    #[error("{worker} of {unit} does not share one GPU, so it stays where it is; only shared work on one GPU moves")]
    NotMovable {
        /// The unit.
        unit: String,
        /// The worker.
        worker: String,
    },
    /// A unit whose workers are on different GPUs.
    #[error("{unit} runs on more than one GPU; a repack moves work from one GPU")]
    Split {
        /// The unit.
        unit: String,
    },
    /// A worker named by two units.
    #[error("{worker} is named by two units; name each worker once")]
    Twice {
        /// The worker.
        worker: String,
    },
    /// A repack asked to free no GPU.
    #[error("Free at least 1 GPU, or leave the number out to free as many as the repack can.")]
    FreeNone,
    /// More GPUs asked for than memory allows.
    #[error("No repack frees {asked} GPUs: by memory, at most {most} can be freed.")]
    TooMany {
        /// GPUs asked for.
        asked: usize,
        /// The most any repack could free.
        most: usize,
    },
    /// The search found no way within its budget.
    #[error("Tessera found no way to free {asked} GPUs within its search; ask for fewer.")]
    NotFound {
        /// GPUs asked for.
        asked: usize,
    },
    /// The moves found cannot be carried out without overfilling a GPU: a fault in the planner.
    #[error("the moves found cannot be ordered without overfilling {gpu}")]
    Unordered {
        /// The GPU that would be overfilled.
        gpu: GpuRef,
    },
}

/// What a repack is planned from, as the server sends it to the browser: the inventory, every holder and
/// what it holds, and the units that may move. The browser plans the preview from it; the server plans
/// again from its own before it commits anything.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepackInput {
    /// The machines and GPUs.
    pub inventory: Inventory,
    /// Every holder and its assignment.
    pub holds: Vec<(String, Assignment)>,
    /// The units that may move.
    pub movable: Vec<Movable>,
    /// How each GPU that is not time-sliced is shared (an MPS GPU takes so many engines).
    #[serde(default)]
    pub sharing: Vec<(GpuRef, Sharing)>,
}

impl RepackInput {
    /// The fleet it describes: every holder held as committed.
    pub fn scheduler(&self) -> Scheduler {
        let mut scheduler = Scheduler::new(self.inventory.clone());
        for (gpu, sharing) in &self.sharing {
            scheduler.set_sharing(gpu, *sharing);
        }
        for (holder, assignment) in &self.holds {
            // What cannot be held at all (a GPU gone from the inventory) holds nothing, as in the ledger.
            let _ = scheduler.hold_committed(holder, assignment.clone());
        }
        scheduler
    }

    /// The repack plan for `goal` with the console's budget.
    pub fn plan(&self, goal: Goal) -> Result<RepackPlan, RepackError> {
        plan_repack(&self.scheduler(), &self.movable, goal, BUDGET)
    }

    /// The same fleet with `shares` held instead of what the holders named there hold now, each a share
    /// of its GPU's memory: what a repack would find once right-sized shares are taken.
    pub fn with_shares(&self, shares: &[(String, BasisPoints)]) -> RepackInput {
        let mut input = self.clone();
        for (holder, assignment) in &mut input.holds {
            let Some((_, share)) = shares.iter().find(|(h, _)| h == holder) else {
                continue;
            };
            let total = input
                .inventory
                .machine(&assignment.machine)
                .and_then(|m| {
                    let first = assignment.gpus.first()?;
                    m.gpus.iter().find(|g| g.index == *first)
                })
                .map(|g| g.total);
            if let (Some(total), Some(_)) = (total, assignment.shared) {
                assignment.shared = Some(total.share(*share));
            }
        }
        input
    }
}

/// A unit as found placed.
struct Unit<'m> {
    movable: &'m Movable,
    gpu: GpuRef,
    held: Vec<(String, Assignment)>,
}

impl Unit<'_> {
    fn memory(&self) -> Bytes {
        self.held.iter().filter_map(|(_, a)| a.shared).sum()
    }
}

/// Plans a repack of `scheduler`'s fleet that moves only `movable` work: the most GPUs freed (or `goal`'s
/// number) with the fewest restarts the search finds in `budget` steps, never a state that breaks a rule.
pub fn plan_repack(
    scheduler: &Scheduler,
    movable: &[Movable],
    goal: Goal,
    budget: u64,
) -> Result<RepackPlan, RepackError> {
    let units = units(scheduler, movable)?;
    let moving: BTreeMap<&str, usize> = units
        .iter()
        .enumerate()
        .flat_map(|(u, unit)| unit.held.iter().map(move |(w, _)| (w.as_str(), u)))
        .collect();
    let inventory = scheduler.inventory();
    let mut gpus = Vec::new();
    let mut instance = Instance::default();
    let mut fixed_names = Vec::new();
    // What the moving units hold on each machine, summed in one pass (not a pass per machine).
    let mut moving_use: BTreeMap<&str, (u32, Bytes)> = BTreeMap::new();
    for (_, a) in units.iter().flat_map(|u| &u.held) {
        let (cpu, memory) = moving_use
            .entry(a.machine.as_str())
            .or_insert((0, Bytes::ZERO));
        *cpu += a.cpu_cores;
        *memory += a.memory;
    }
    for (m, machine) in inventory.machines().iter().enumerate() {
        let (cpu_used, memory_used) = scheduler.machine_use(&machine.name).unwrap_or_default();
        let (cpu_moving, memory_moving) = moving_use
            .get(machine.name.as_str())
            .copied()
            .unwrap_or((0, Bytes::ZERO));
        instance.machines.push(Room {
            cpu_cores: machine.cpu_cores.saturating_sub(cpu_used - cpu_moving),
            memory: machine
                .memory
                .saturating_sub(memory_used - memory_moving)
                .get(),
        });
        if machine.all_gpus_visible {
            continue;
        }
        for gpu in &machine.gpus {
            let at = GpuRef::new(&machine.name, gpu.index);
            let fixed: Vec<(String, Bytes)> = match scheduler.hold(&at) {
                Some(Hold::Shared(sharers)) => sharers
                    .iter()
                    .filter(|(w, _)| !moving.contains_key(w.as_str()))
                    .map(|(w, b)| (w.clone(), *b))
                    .collect(),
                Some(Hold::Free) => Vec::new(),
                _ => continue,
            };
            let load: Bytes = fixed.iter().map(|(_, b)| *b).sum();
            instance.bins.push(Bin {
                room: gpu.offered().saturating_sub(load).get(),
                machine: m,
                fixed: !fixed.is_empty(),
            });
            fixed_names.push(fixed);
            gpus.push(at);
        }
    }
    // An MPS GPU takes a bounded number of engines: work moves onto one only where, whatever else moves
    // there too, the bound holds (a conservative rule: with room for fewer, nothing new goes there).
    let engines: usize = units.iter().map(|u| u.held.len()).sum();
    let takes_newcomers: Vec<bool> = gpus
        .iter()
        .zip(&fixed_names)
        .map(|(gpu, fixed)| {
            scheduler.sharing(gpu) != Sharing::Mps || fixed.len() + engines <= MPS_MAX_CLIENTS
        })
        .collect();
    let bin_of: BTreeMap<&GpuRef, usize> = gpus.iter().enumerate().map(|(b, g)| (g, b)).collect();
    // The units alike (the same request; for a group, the same GPU size) make one kind, whose bins are
    // judged once: a fleet's units against a fleet's GPUs would be judged units × GPUs times.
    let mut kinds: Vec<(&GpuDemand, Option<Option<Bytes>>)> = Vec::new();
    for unit in &units {
        let origin = *bin_of
            .get(&unit.gpu)
            .expect("a unit's GPU is shared, so it is a bin");
        let origin_total = inventory.gpu(&unit.gpu).map(|g| g.total);
        let like = (
            &unit.movable.demand,
            unit.movable.same_size.then_some(origin_total),
        );
        let kind = match kinds.iter().position(|k| *k == like) {
            Some(kind) => kind,
            None => {
                instance.kinds.push(
                    gpus.iter()
                        .enumerate()
                        .map(|(b, gpu)| {
                            takes_newcomers[b]
                                && scheduler.admits(gpu, like.0)
                                && like.1.is_none_or(|total| {
                                    inventory.gpu(gpu).map(|g| g.total) == total
                                })
                        })
                        .collect(),
                );
                kinds.push(like);
                kinds.len() - 1
            }
        };
        instance.items.push(Item {
            size: unit.memory().get(),
            needs: Room {
                cpu_cores: unit.held.iter().map(|(_, a)| a.cpu_cores).sum(),
                memory: unit.held.iter().map(|(_, a)| a.memory).sum::<Bytes>().get(),
            },
            origin,
            restarts: unit.held.len(),
            kind,
            home: Some(origin),
        });
    }
    let most = instance.used_now().saturating_sub(instance.lower_bound());
    let packing = pack(&instance, goal, budget).map_err(|shortfall| {
        let asked = match goal {
            Goal::Free(n) => n,
            Goal::Most => 0,
        };
        match shortfall {
            Shortfall::Impossible { most } => RepackError::TooMany { asked, most },
            Shortfall::NotFound => RepackError::NotFound { asked },
        }
    })?;
    let moves: Vec<Move> = units
        .iter()
        .zip(&packing.bins)
        .filter(|(unit, &b)| gpus[b] != unit.gpu)
        .map(|(unit, &b)| Move {
            unit: unit.movable.name.clone(),
            workers: unit.held.iter().map(|(w, _)| w.clone()).collect(),
            from: unit.gpu.clone(),
            to: gpus[b].clone(),
            memory: unit.memory(),
        })
        .collect();
    let loads = |bins: &[usize]| -> Vec<GpuLoad> {
        gpus.iter()
            .enumerate()
            .map(|(b, gpu)| {
                let mut sharers: Vec<String> =
                    fixed_names[b].iter().map(|(w, _)| w.clone()).collect();
                let mut taken: Bytes = fixed_names[b].iter().map(|(_, m)| *m).sum();
                for (unit, _) in units.iter().zip(bins).filter(|(_, &x)| x == b) {
                    sharers.push(unit.movable.name.clone());
                    taken += unit.memory();
                }
                sharers.sort();
                GpuLoad {
                    gpu: gpu.clone(),
                    offered: inventory.gpu(gpu).map_or(Bytes::ZERO, |g| g.offered()),
                    taken,
                    sharers,
                }
            })
            .collect()
    };
    let now: Vec<usize> = instance.items.iter().map(|i| i.origin).collect();
    let before = loads(&now);
    let after = loads(&packing.bins);
    let turned = |from_busy: bool| {
        before
            .iter()
            .zip(&after)
            .filter(|(b, a)| b.sharers.is_empty() != from_busy && a.sharers.is_empty() == from_busy)
            .map(|(b, _)| b.gpu.clone())
            .collect()
    };
    let freed = turned(true);
    let filled = turned(false);
    let steps = sequence(scheduler, &units, &moves)?;
    Ok(RepackPlan {
        restarts: moves.iter().map(|m| m.workers.len()).sum(),
        moves,
        freed,
        filled,
        most,
        steps,
        before,
        after,
    })
}

/// Each movable unit as placed, checked: placed workers, each shared on one GPU, all on the same one.
fn units<'m>(scheduler: &Scheduler, movable: &'m [Movable]) -> Result<Vec<Unit<'m>>, RepackError> {
    let mut seen = BTreeSet::new();
    let mut units = Vec::with_capacity(movable.len());
    for m in movable {
        let mut gpu: Option<GpuRef> = None;
        let mut held = Vec::with_capacity(m.workers.len());
        for worker in &m.workers {
            if !seen.insert(worker.as_str()) {
                return Err(RepackError::Twice {
                    worker: worker.clone(),
                });
            }
            let assignment =
                scheduler
                    .workers()
                    .get(worker)
                    .ok_or_else(|| RepackError::UnknownWorker {
                        unit: m.name.clone(),
                        worker: worker.clone(),
                    })?;
            let visible_apart = scheduler
                .inventory()
                .machine(&assignment.machine)
                .is_some_and(|machine| !machine.all_gpus_visible);
            let [index] = assignment.gpus[..] else {
                return Err(not_movable(m, worker));
            };
            if assignment.shared.is_none() || !visible_apart {
                return Err(not_movable(m, worker));
            }
            let at = GpuRef::new(&assignment.machine, index);
            if gpu.get_or_insert_with(|| at.clone()) != &at {
                return Err(RepackError::Split {
                    unit: m.name.clone(),
                });
            }
            held.push((worker.clone(), assignment.clone()));
        }
        let Some(gpu) = gpu else {
            continue;
        };
        units.push(Unit {
            movable: m,
            gpu,
            held,
        });
    }
    Ok(units)
}

fn not_movable(m: &Movable, worker: &str) -> RepackError {
    RepackError::NotMovable {
        unit: m.name.clone(),
        worker: worker.to_owned(),
    }
}

/// Orders the moves so that each start finds room: a unit moves as soon as its new GPU has room for it; when
/// none can (units that trade places), one is stopped first and started once there is room. Each start is
/// checked by the scheduler against what the GPU offers and what its machine has left.
fn sequence(
    scheduler: &Scheduler,
    units: &[Unit],
    moves: &[Move],
) -> Result<Vec<RepackStep>, RepackError> {
    let mut fleet = scheduler.clone();
    let mut steps = Vec::new();
    // Looked up, not searched: a fleet's repack moves tens of thousands of units.
    let by_name: BTreeMap<&str, &Unit> =
        units.iter().map(|u| (u.movable.name.as_str(), u)).collect();
    let unit_of = |name: &str| *by_name.get(name).expect("a move is of a unit");
    let mut pending: Vec<(&Move, bool)> = moves.iter().map(|m| (m, false)).collect();
    while !pending.is_empty() {
        let mut progressed = false;
        // One pass in order: what starts leaves the list, what cannot yet stays in it, in its place.
        let mut waiting = Vec::with_capacity(pending.len());
        for (mv, stopped) in pending {
            let unit = unit_of(&mv.unit);
            if !stopped {
                for (worker, _) in &unit.held {
                    fleet.release(worker);
                }
            }
            if start(&mut fleet, unit, &mv.to) {
                if !stopped {
                    steps.push(RepackStep::Stop {
                        unit: mv.unit.clone(),
                        gpu: mv.from.clone(),
                    });
                }
                steps.push(RepackStep::Start {
                    unit: mv.unit.clone(),
                    gpu: mv.to.clone(),
                });
                progressed = true;
            } else {
                if !stopped {
                    for (worker, assignment) in &unit.held {
                        fleet
                            .hold_committed(worker, assignment.clone())
                            .expect("it held this a moment ago");
                    }
                }
                waiting.push((mv, stopped));
            }
        }
        pending = waiting;
        if progressed {
            continue;
        }
        let Some(park) = pending.iter_mut().find(|(_, stopped)| !stopped) else {
            return Err(RepackError::Unordered {
                gpu: pending[0].0.to.clone(),
            });
        };
        park.1 = true;
        for (worker, _) in &unit_of(&park.0.unit).held {
            fleet.release(worker);
        }
        steps.push(RepackStep::Stop {
            unit: park.0.unit.clone(),
            gpu: park.0.from.clone(),
        });
    }
    Ok(steps)
}

/// Holds `unit`'s workers on `gpu` if all of them fit there now; otherwise holds none.
fn start(fleet: &mut Scheduler, unit: &Unit, gpu: &GpuRef) -> bool {
    for (n, (worker, assignment)) in unit.held.iter().enumerate() {
        if fleet.hold_for(worker, assignment.moved_to(gpu)).is_err() {
            for (held, _) in &unit.held[..n] {
                fleet.release(held);
            }
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests;
