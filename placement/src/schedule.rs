//! Placing workers on GPUs: whole or shared by memory, best fit, with a reason for every GPU that says no.

use crate::inventory::{Gpu, GpuRef, Inventory, Machine};
use crate::reason::PendingReason;
use crate::request::{GpuDemand, GpuMode, Policy, WorkerRequest};
use crate::sharing::Sharing;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Range;

/// Where a worker runs and what it holds there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The machine.
    pub machine: String,
    /// The GPU indices it holds, ascending.
    pub gpus: Vec<u32>,
    /// When shared, the memory it takes on each of those GPUs.
    pub shared: Option<Bytes>,
    /// CPU cores it holds.
    pub cpu_cores: u32,
    /// Memory it holds.
    pub memory: Bytes,
}

impl Assignment {
    /// The same hold (its memory, CPU cores and machine memory) on one GPU elsewhere: a unit moved by a repack.
    pub fn moved_to(&self, gpu: &GpuRef) -> Assignment {
        Assignment {
            machine: gpu.machine.clone(),
            gpus: vec![gpu.index],
            ..self.clone()
        }
    }
}

/// The scheduler's answer for one worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// It fits here.
    Place(Assignment),
    /// It fits nowhere now, for these reasons.
    Wait(Vec<PendingReason>),
}

/// Who holds a GPU. A GPU is free, held whole by one worker, or shared; never both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hold {
    /// Nobody.
    Free,
    /// One worker, whole.
    Whole(String),
    /// Shared workers and the memory each takes.
    Shared(BTreeMap<String, Bytes>),
}

impl Hold {
    /// Memory its sharers take (zero unless shared).
    pub fn taken(&self) -> Bytes {
        match self {
            Hold::Shared(sharers) => sharers.values().copied().sum(),
            _ => Bytes::ZERO,
        }
    }
}

/// A worker the scheduler cannot take as given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// A worker of that name holds resources already.
    #[error("a worker named {0} is already placed")]
    AlreadyPlaced(String),
    /// The assignment names a machine or GPU the inventory does not have.
    #[error("{0} is not in the inventory")]
    Unknown(String),
    /// The assignment does not fit what is free now.
    #[error("{0}")]
    DoesNotFit(PendingReason),
}

/// A GPU whose sharers take more than it offers: what was committed no longer fits (more is held outside
/// Tessera now, or the GPU reports less memory). Nothing new is placed on it until enough sharers end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overcommit {
    /// The GPU.
    pub gpu: GpuRef,
    /// All of its memory.
    pub total: Bytes,
    /// Memory held outside Tessera.
    pub held_outside: Bytes,
    /// What its sharers take.
    pub taken: Bytes,
}

impl Overcommit {
    /// What the GPU offers: its total less what is held outside.
    pub fn offered(&self) -> Bytes {
        self.total.saturating_sub(self.held_outside)
    }

    /// How much its sharers take past what it offers.
    pub fn over(&self) -> Bytes {
        self.taken.saturating_sub(self.offered())
    }
}

impl fmt::Display for Overcommit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gpu = &self.gpu;
        if self.held_outside > Bytes::ZERO {
            write!(
                f,
                "{gpu} offers {} of its {} ({} held outside Tessera) but its sharers take {}: {} over",
                self.offered().gb_text(),
                self.total,
                self.held_outside,
                self.taken,
                self.over()
            )
        } else {
            write!(
                f,
                "{gpu} offers all of its {} but its sharers take {}: {} over",
                self.total,
                self.taken,
                self.over()
            )
        }
    }
}

/// How strictly a hold is checked before it is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Everything must fit what is free now.
    Fits,
    /// Only who holds the GPUs: what was committed is held even past a GPU's or machine's memory.
    Holders,
}

#[derive(Clone)]
struct GpuSlot {
    machine: usize,
    pos: usize,
    hold: Hold,
    taken: Bytes,
    sharing: Sharing,
}

#[derive(Clone)]
struct MachineUse {
    cpu_used: u32,
    memory_used: Bytes,
    gpus: Range<usize>,
}

/// What one GPU says to one demand.
enum Fit {
    /// It fits, leaving this much room (bytes for shared work; zero for whole).
    Yes(u64),
    /// It does not, for this reason.
    No(PendingReason),
    /// The demand's ids leave it out: no reason worth telling.
    NotAsked,
}

/// The best-fit order: least left over, then machine name, then GPU index (flat ids follow both).
type FitKey = (u64, usize);

/// The most reasons a waiting worker lists: at fleet size every GPU has one, and ten thousand lines say
/// less than the few nearest to fitting.
pub const REASONS_LISTED: usize = 8;

/// The fleet's GPUs and who holds them; places workers by best fit.
#[derive(Clone)]
pub struct Scheduler {
    inventory: Inventory,
    gpus: Vec<GpuSlot>,
    machines: Vec<MachineUse>,
    workers: BTreeMap<String, Assignment>,
    /// Shareable GPUs of machines that see their GPUs apart, by room left then flat id, so the best fit for one
    /// shared GPU is the first entry at or above the need.
    by_room: BTreeSet<(u64, usize)>,
    /// The GPUs whose sharers take more than they offer, by flat id: every write asks for them, and a
    /// fleet's 10,000 GPUs are not walked for the few.
    over: BTreeSet<usize>,
    all_visible: Vec<usize>,
}

impl Scheduler {
    /// A scheduler over `inventory` with nothing placed.
    pub fn new(inventory: Inventory) -> Scheduler {
        let mut gpus = Vec::new();
        let mut machines = Vec::new();
        let mut all_visible = Vec::new();
        for (m, machine) in inventory.machines().iter().enumerate() {
            let start = gpus.len();
            gpus.extend((0..machine.gpus.len()).map(|pos| GpuSlot {
                machine: m,
                pos,
                hold: Hold::Free,
                taken: Bytes::ZERO,
                sharing: Sharing::TimeSlicing,
            }));
            machines.push(MachineUse {
                cpu_used: 0,
                memory_used: Bytes::ZERO,
                gpus: start..gpus.len(),
            });
            if machine.all_gpus_visible {
                all_visible.push(m);
            }
        }
        let mut s = Scheduler {
            inventory,
            gpus,
            machines,
            workers: BTreeMap::new(),
            by_room: BTreeSet::new(),
            over: BTreeSet::new(),
            all_visible,
        };
        for id in 0..s.gpus.len() {
            s.index(id);
        }
        s
    }

    /// The inventory it places on.
    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// Every placed worker and where it runs.
    pub fn workers(&self) -> &BTreeMap<String, Assignment> {
        &self.workers
    }

    /// Who holds this GPU and how much its sharers take.
    pub fn hold(&self, gpu: &GpuRef) -> Option<&Hold> {
        self.flat_id(gpu).map(|id| &self.gpus[id].hold)
    }

    /// Shares `gpu` the way `sharing` says from now on, which decides what sharers it takes (see
    /// [`crate::sharing`]). A GPU the inventory does not have is left alone.
    pub fn set_sharing(&mut self, gpu: &GpuRef, sharing: Sharing) {
        if let Some(id) = self.flat_id(gpu) {
            self.gpus[id].sharing = sharing;
        }
    }

    /// How `gpu` is shared: time-sliced unless set otherwise.
    pub fn sharing(&self, gpu: &GpuRef) -> Sharing {
        self.flat_id(gpu)
            .map_or(Sharing::TimeSlicing, |id| self.gpus[id].sharing)
    }

    /// CPU cores and memory that workers hold on this machine.
    pub fn machine_use(&self, machine: &str) -> Option<(u32, Bytes)> {
        let m = self.machine_index(machine)?;
        Some((self.machines[m].cpu_used, self.machines[m].memory_used))
    }

    /// Whether `demand`'s filters (ids, health, vendor, models) let it onto this GPU, whatever holds it now.
    pub fn admits(&self, gpu: &GpuRef, demand: &GpuDemand) -> bool {
        self.flat_id(gpu)
            .is_some_and(|id| self.filter_refusal(id, demand).is_none())
    }

    /// [`Scheduler::decide`] for a request that waited when it was last decided, where only the machines
    /// `changed` names may have changed since (their holds, what they offer, how their GPUs are shared).
    /// The others turned it away then and would now: unless one of `changed` can take it, it waits, and
    /// only its reasons are made again (a few, found without a walk through the fleet). So a write asks
    /// again for every waiting worker at the cost of what it changed, not of the fleet. Changes nothing.
    pub fn decide_again(&self, request: &WorkerRequest, changed: &BTreeSet<String>) -> Decision {
        let takes = |m: usize| match &request.gpus {
            Some(demand) => self.machine_choice(m, request, demand).is_ok(),
            None => self
                .machine_refusal(m, request.cpu_cores, request.memory)
                .is_none(),
        };
        let shared_one = request
            .gpus
            .as_ref()
            .is_some_and(|d| d.count == 1 && matches!(d.mode, GpuMode::Shared(_)));
        if shared_one
            || changed
                .iter()
                .filter_map(|name| self.machine_index(name))
                .any(takes)
        {
            return self.decide(request);
        }
        Decision::Wait(match &request.gpus {
            Some(demand) => self.reasons(request, demand),
            None => self.machine_reasons(request),
        })
    }

    /// Where `request` would go now, or why it waits. Changes nothing.
    pub fn decide(&self, request: &WorkerRequest) -> Decision {
        let Some(demand) = &request.gpus else {
            return self.decide_without_gpus(request);
        };
        let best = match demand.mode {
            GpuMode::Shared(need) if demand.count == 1 => {
                self.best_single_shared(request, demand, need)
            }
            _ => self.best_by_machine(request, demand, 0..self.machines.len()),
        };
        match best {
            Some((_, assignment)) => Decision::Place(assignment),
            None => Decision::Wait(self.reasons(request, demand)),
        }
    }

    /// Decides and, when it fits, holds the resources for `worker`.
    pub fn place(
        &mut self,
        worker: &str,
        request: &WorkerRequest,
    ) -> Result<Decision, ScheduleError> {
        if self.workers.contains_key(worker) {
            return Err(ScheduleError::AlreadyPlaced(worker.to_owned()));
        }
        let decision = self.decide(request);
        if let Decision::Place(assignment) = &decision {
            self.hold_for(worker, assignment.clone())?;
        }
        Ok(decision)
    }

    /// Holds a known assignment for `worker` (as restored from storage), checking that it still fits.
    pub fn hold_for(&mut self, worker: &str, assignment: Assignment) -> Result<(), ScheduleError> {
        let (m, ids) = self.check_hold(worker, &assignment, Check::Fits)?;
        self.take(worker, assignment, m, ids);
        Ok(())
    }

    /// Holds what was committed for `worker` even where it no longer fits: memory past what a GPU offers
    /// (the GPU is then over-committed, see [`Scheduler::overcommitted`]) and CPU cores or memory past the
    /// machine's are held anyway, so that nothing new is placed in their room.
    ///
    /// Refuses only what cannot be held at all: a worker placed already, a machine or GPU the inventory does
    /// not have, whole work on a GPU that is shared or held, and shared work on a GPU held whole.
    pub fn hold_committed(
        &mut self,
        worker: &str,
        assignment: Assignment,
    ) -> Result<(), ScheduleError> {
        let (m, ids) = self.check_hold(worker, &assignment, Check::Holders)?;
        self.take(worker, assignment, m, ids);
        Ok(())
    }

    /// Every GPU whose sharers take more than it offers, in inventory order.
    pub fn overcommitted(&self) -> Vec<Overcommit> {
        self.over
            .iter()
            .map(|&id| {
                let gpu = self.gpu(id);
                Overcommit {
                    gpu: self.gpu_ref(id),
                    total: gpu.total,
                    held_outside: gpu.held_outside,
                    taken: self.gpus[id].taken,
                }
            })
            .collect()
    }

    /// Takes a new reading of `machine` where only what other programs hold on its GPUs, and whether each
    /// is healthy, changed ([`Machine::same_but_readings`]): each of its GPUs' room is indexed again, and
    /// everything held stays held, as [`Scheduler::hold_committed`] keeps it past what a GPU offers. Says
    /// whether it was such a reading; any other change of a machine needs a scheduler built anew.
    pub fn read_again(&mut self, machine: &Machine) -> bool {
        let Some(m) = self.machine_index(&machine.name) else {
            return false;
        };
        if !self.inventory.machines()[m].same_but_readings(machine) {
            return false;
        }
        let ids = self.machines[m].gpus.clone();
        for id in ids.clone() {
            self.unindex(id);
        }
        self.inventory.set_readings(m, machine);
        for id in ids {
            self.index(id);
        }
        true
    }

    /// Frees what `worker` holds. A shared GPU is whole again once its last sharer ends.
    pub fn release(&mut self, worker: &str) -> Option<Assignment> {
        let assignment = self.workers.remove(worker)?;
        let m = self.machine_index(&assignment.machine)?;
        for &index in &assignment.gpus {
            let Some(id) = self.flat_id(&GpuRef::new(&assignment.machine, index)) else {
                continue;
            };
            self.unindex(id);
            let slot = &mut self.gpus[id];
            if let Hold::Shared(sharers) = &mut slot.hold {
                if let Some(bytes) = sharers.remove(worker) {
                    slot.taken = slot.taken - bytes;
                }
                if sharers.is_empty() {
                    slot.hold = Hold::Free;
                }
            } else if slot.hold == Hold::Whole(worker.to_owned()) {
                slot.hold = Hold::Free;
            }
            self.index(id);
        }
        let used = &mut self.machines[m];
        used.cpu_used -= assignment.cpu_cores;
        used.memory_used = used.memory_used - assignment.memory;
        Some(assignment)
    }

    fn machine(&self, m: usize) -> &Machine {
        &self.inventory.machines()[m]
    }

    fn gpu(&self, id: usize) -> &Gpu {
        let slot = &self.gpus[id];
        &self.machine(slot.machine).gpus[slot.pos]
    }

    fn gpu_ref(&self, id: usize) -> GpuRef {
        let slot = &self.gpus[id];
        GpuRef::new(&self.machine(slot.machine).name, self.gpu(id).index)
    }

    fn flat_id(&self, gpu: &GpuRef) -> Option<usize> {
        let m = self.machine_index(&gpu.machine)?;
        self.machines[m]
            .gpus
            .clone()
            .find(|&id| self.gpu(id).index == gpu.index)
    }

    fn room(&self, id: usize) -> u64 {
        self.gpu(id)
            .offered()
            .saturating_sub(self.gpus[id].taken)
            .get()
    }

    fn index(&mut self, id: usize) {
        let slot = &self.gpus[id];
        if slot.taken > self.gpu(id).offered() {
            self.over.insert(id);
        }
        if !matches!(slot.hold, Hold::Whole(_)) && !self.machine(slot.machine).all_gpus_visible {
            self.by_room.insert((self.room(id), id));
        }
    }

    fn unindex(&mut self, id: usize) {
        self.by_room.remove(&(self.room(id), id));
        self.over.remove(&id);
    }

    fn machine_index(&self, name: &str) -> Option<usize> {
        self.inventory
            .machines()
            .binary_search_by(|x| x.name.as_str().cmp(name))
            .ok()
    }

    /// The machine and the GPUs (flat ids, ascending, each once) `assignment` holds, or why `worker` cannot
    /// hold it as `check` asks. Changes nothing.
    fn check_hold(
        &self,
        worker: &str,
        assignment: &Assignment,
        check: Check,
    ) -> Result<(usize, Vec<usize>), ScheduleError> {
        if self.workers.contains_key(worker) {
            return Err(ScheduleError::AlreadyPlaced(worker.to_owned()));
        }
        let m = self
            .machine_index(&assignment.machine)
            .ok_or_else(|| ScheduleError::Unknown(assignment.machine.clone()))?;
        if check == Check::Fits {
            if let Some(reason) = self.machine_refusal(m, assignment.cpu_cores, assignment.memory) {
                return Err(ScheduleError::DoesNotFit(reason));
            }
        }
        let mode = assignment.shared.map_or(GpuMode::Whole, GpuMode::Shared);
        // Every GPU is found before any is asked for room: a GPU gone from the inventory is the reason
        // whatever else holds the others, and in whatever order the holders were held.
        let ids = assignment
            .gpus
            .iter()
            .map(|&index| {
                let gpu = GpuRef::new(&assignment.machine, index);
                self.flat_id(&gpu)
                    .ok_or_else(|| ScheduleError::Unknown(gpu.to_string()))
            })
            .collect::<Result<Vec<usize>, _>>()?;
        for &id in &ids {
            let refusal = match check {
                Check::Fits => self.capacity_refusal(id, mode, assignment.gpus.len()),
                Check::Holders => self.holder_refusal(id, mode),
            };
            if let Some(reason) = refusal {
                return Err(ScheduleError::DoesNotFit(reason));
            }
        }
        let mut ids = ids;
        // A GPU listed twice is held once: its memory is taken once, as release gives it back once.
        ids.sort_unstable();
        ids.dedup();
        Ok((m, ids))
    }

    /// Holds `assignment` for `worker` on machine `m` and GPUs `ids`, as [`Scheduler::check_hold`] found them,
    /// keeping the room index in step.
    fn take(&mut self, worker: &str, assignment: Assignment, m: usize, ids: Vec<usize>) {
        for id in ids {
            self.unindex(id);
            let slot = &mut self.gpus[id];
            match assignment.shared {
                None => slot.hold = Hold::Whole(worker.to_owned()),
                Some(bytes) => {
                    if slot.hold == Hold::Free {
                        slot.hold = Hold::Shared(BTreeMap::new());
                    }
                    if let Hold::Shared(sharers) = &mut slot.hold {
                        sharers.insert(worker.to_owned(), bytes);
                    }
                    slot.taken += bytes;
                }
            }
            self.index(id);
        }
        let used = &mut self.machines[m];
        used.cpu_used += assignment.cpu_cores;
        used.memory_used += assignment.memory;
        self.workers.insert(worker.to_owned(), assignment);
    }

    /// One shared GPU: the first indexed GPU at or above the need that passes the filters, against the
    /// machines whose GPUs are all visible (which take memory on each GPU and so are weighed whole).
    fn best_single_shared(
        &self,
        request: &WorkerRequest,
        demand: &GpuDemand,
        need: Bytes,
    ) -> Option<(FitKey, Assignment)> {
        let indexed = self
            .by_room
            .range((need.get(), 0)..)
            .find_map(|&(room, id)| {
                let m = self.gpus[id].machine;
                let fits = matches!(self.fit(id, demand), Fit::Yes(_))
                    && self
                        .machine_refusal(m, request.cpu_cores, request.memory)
                        .is_none();
                fits.then(|| {
                    (
                        (room - need.get(), id),
                        self.assignment(m, vec![id], request),
                    )
                })
            });
        let visible = self
            .all_visible
            .iter()
            .filter_map(|&m| self.machine_choice(m, request, demand).ok());
        indexed
            .into_iter()
            .chain(visible)
            .min_by_key(|(key, _)| *key)
    }

    fn best_by_machine(
        &self,
        request: &WorkerRequest,
        demand: &GpuDemand,
        machines: Range<usize>,
    ) -> Option<(FitKey, Assignment)> {
        machines
            .filter_map(|m| self.machine_choice(m, request, demand).ok())
            .min_by_key(|(key, _)| *key)
    }

    /// The best GPUs of machine `m` for the request, or every reason it cannot take it.
    fn machine_choice(
        &self,
        m: usize,
        request: &WorkerRequest,
        demand: &GpuDemand,
    ) -> Result<(FitKey, Assignment), Vec<PendingReason>> {
        let ids = self.machines[m].gpus.clone();
        if ids.is_empty() {
            return Err(Vec::new());
        }
        if let Some(reason) = self.machine_refusal(m, request.cpu_cores, request.memory) {
            return Err(vec![reason]);
        }
        let every_gpu = demand.policy == Policy::All
            || (self.machine(m).all_gpus_visible && matches!(demand.mode, GpuMode::Shared(_)));
        let mut fits = Vec::new();
        let mut reasons = Vec::new();
        for id in ids.clone() {
            match self.fit(id, demand) {
                Fit::Yes(left) => fits.push((left, id)),
                Fit::No(reason) => reasons.push(reason),
                Fit::NotAsked if every_gpu => {}
                Fit::NotAsked => continue,
            }
        }
        if every_gpu {
            let enough = reasons.is_empty()
                && fits.len() == ids.len()
                && fits.len() >= demand.count as usize;
            if !enough {
                if reasons.is_empty() && fits.len() < demand.count as usize {
                    reasons.push(self.too_few(m, fits.len(), demand.count));
                }
                return Err(reasons);
            }
            let left = fits.iter().map(|(l, _)| l).sum();
            return Ok((
                (left, ids.start),
                self.assignment(m, ids.collect(), request),
            ));
        }
        if fits.len() < demand.count as usize {
            if !fits.is_empty() {
                reasons.push(self.too_few(m, fits.len(), demand.count));
            }
            return Err(reasons);
        }
        let count = demand.count as usize;
        let left = match demand.mode {
            // Shared: the fullest GPUs that fit, weighed by the memory they leave.
            GpuMode::Shared(_) => {
                fits.sort_unstable();
                fits.truncate(count);
                fits.iter().map(|(l, _)| l).sum()
            }
            // Whole: the lowest indices, weighed by the free GPUs the machine keeps, so others stay whole.
            GpuMode::Whole => {
                let left = (fits.len() - count) as u64;
                fits.truncate(count);
                left
            }
        };
        let mut ids: Vec<usize> = fits.into_iter().map(|(_, id)| id).collect();
        ids.sort_unstable();
        Ok(((left, ids[0]), self.assignment(m, ids, request)))
    }

    fn assignment(&self, m: usize, ids: Vec<usize>, request: &WorkerRequest) -> Assignment {
        Assignment {
            machine: self.machine(m).name.clone(),
            gpus: ids.into_iter().map(|id| self.gpu(id).index).collect(),
            shared: request.shared_memory(),
            cpu_cores: request.cpu_cores,
            memory: request.memory,
        }
    }

    /// A worker without GPUs goes to the machine left with the least free memory, then by name.
    fn decide_without_gpus(&self, request: &WorkerRequest) -> Decision {
        let mut best: Option<(u64, usize)> = None;
        for m in 0..self.machines.len() {
            if self
                .machine_refusal(m, request.cpu_cores, request.memory)
                .is_none()
            {
                let left = (self
                    .machine(m)
                    .memory
                    .saturating_sub(self.machines[m].memory_used)
                    - request.memory)
                    .get();
                if best.is_none_or(|(l, _)| left < l) {
                    best = Some((left, m));
                }
            }
        }
        match best {
            Some((_, m)) => Decision::Place(self.assignment(m, Vec::new(), request)),
            None => Decision::Wait(self.machine_reasons(request)),
        }
    }
}

mod refusals;

#[cfg(test)]
mod tests;
