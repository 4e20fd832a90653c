//! Why a machine or a GPU says no to a worker: each refusal is a pending reason in seed 000's words, and a
//! GPU that says yes says how much room it leaves, for best fit to weigh.

use super::{Fit, Hold, Scheduler, REASONS_LISTED};
use crate::inventory::MigRole;
use crate::reason::PendingReason;
use crate::request::{GpuDemand, GpuMode, WorkerRequest};
use crate::sharing::{Sharing, MPS_MAX_CLIENTS};
use crate::units::Bytes;

impl Scheduler {
    /// Why this machine's free CPU cores or memory cannot take `cores` and `memory`, if they cannot.
    pub(super) fn machine_refusal(
        &self,
        m: usize,
        cores: u32,
        memory: Bytes,
    ) -> Option<PendingReason> {
        let machine = self.machine(m);
        let used = &self.machines[m];
        let free_cores = machine.cpu_cores.saturating_sub(used.cpu_used);
        if cores > free_cores {
            return Some(PendingReason::TooFewCpuCores {
                machine: machine.name.clone(),
                free: free_cores,
                total: machine.cpu_cores,
                needs: cores,
            });
        }
        let free_memory = machine.memory.saturating_sub(used.memory_used);
        if memory > free_memory {
            return Some(PendingReason::TooLittleMemory {
                machine: machine.name.clone(),
                free: free_memory,
                total: machine.memory,
                needs: memory,
            });
        }
        None
    }

    /// Why the GPU's holders alone leave no room for `mode`: held whole, or shared when whole is wanted.
    pub(super) fn holder_refusal(&self, id: usize, mode: GpuMode) -> Option<PendingReason> {
        match (&self.gpus[id].hold, mode) {
            (Hold::Whole(by), _) => Some(PendingReason::HeldWhole {
                gpu: self.gpu_ref(id),
                by: by.clone(),
            }),
            (Hold::Shared(sharers), GpuMode::Whole) => Some(PendingReason::Shared {
                gpu: self.gpu_ref(id),
                sharers: sharers.len(),
            }),
            _ => None,
        }
    }

    /// Why the GPU's holders or memory leave no room for `mode`, ignoring the request's filters. An
    /// over-committed GPU has no room for shared work of any size.
    pub(super) fn capacity_refusal(
        &self,
        id: usize,
        mode: GpuMode,
        gpus: usize,
    ) -> Option<PendingReason> {
        if let Some(reason) = self.holder_refusal(id, mode) {
            return Some(reason);
        }
        let GpuMode::Shared(need) = mode else {
            return None;
        };
        let taken = self.gpus[id].taken;
        let gpu = self.gpu(id);
        if let Some(reason) = self.mps_refusal(id, gpus) {
            Some(reason)
        } else if need > gpu.offered() {
            Some(PendingReason::OffersTooLittle {
                gpu: self.gpu_ref(id),
                total: gpu.total,
                held_outside: gpu.held_outside,
                needs: need,
            })
        } else if taken + need > gpu.offered() {
            Some(PendingReason::SharedFull {
                gpu: self.gpu_ref(id),
                taken,
                offered: gpu.offered(),
                needs: need,
            })
        } else {
            None
        }
    }

    /// How an MPS GPU turns away one more sharer on `gpus` GPUs: each engine is a client of its GPU's own
    /// MPS server, which takes [`MPS_MAX_CLIENTS`] and sees that GPU alone.
    pub(super) fn mps_refusal(&self, id: usize, gpus: usize) -> Option<PendingReason> {
        if self.gpus[id].sharing != Sharing::Mps {
            return None;
        }
        let sharers = match &self.gpus[id].hold {
            Hold::Shared(sharers) => sharers.len(),
            Hold::Whole(_) | Hold::Free => 0,
        };
        if gpus > 1 {
            Some(PendingReason::MpsOneGpu {
                gpu: self.gpu_ref(id),
            })
        } else if sharers >= MPS_MAX_CLIENTS {
            Some(PendingReason::MpsFull {
                gpu: self.gpu_ref(id),
            })
        } else {
            None
        }
    }

    /// How the demand's filters (ids, health, vendor, models) turn this GPU away, whatever holds it.
    pub(super) fn filter_refusal(&self, id: usize, demand: &GpuDemand) -> Option<Fit> {
        let gpu = self.gpu(id);
        let machine = &self.machine(self.gpus[id].machine).name;
        if !demand.ids.is_empty() && !demand.ids.iter().any(|i| gpu.is_named_by(machine, i)) {
            return Some(Fit::NotAsked);
        }
        match (&gpu.mig, demand.mode) {
            (Some(MigRole::Cut), _) => {
                return Some(Fit::No(PendingReason::CutIntoInstances {
                    gpu: self.gpu_ref(id),
                }))
            }
            (Some(MigRole::Instance { .. }), GpuMode::Shared(_)) => {
                return Some(Fit::No(PendingReason::InstanceHeldWhole {
                    gpu: self.gpu_ref(id),
                }))
            }
            (Some(MigRole::Instance { .. }), GpuMode::Whole) if demand.count > 1 => {
                return Some(Fit::No(PendingReason::InstanceAlone {
                    gpu: self.gpu_ref(id),
                }))
            }
            _ => {}
        }
        if demand.healthy_only && !gpu.healthy {
            return Some(Fit::No(PendingReason::Unhealthy {
                gpu: self.gpu_ref(id),
            }));
        }
        if let Some(vendor) = &demand.vendor {
            if !gpu.vendor.eq_ignore_ascii_case(vendor) {
                return Some(Fit::No(PendingReason::WrongVendor {
                    gpu: self.gpu_ref(id),
                    vendor: gpu.vendor.clone(),
                    wanted: vendor.clone(),
                }));
            }
        }
        if !demand.models.is_empty()
            && !demand
                .models
                .iter()
                .any(|m| m.eq_ignore_ascii_case(&gpu.model))
        {
            return Some(Fit::No(PendingReason::WrongModel {
                gpu: self.gpu_ref(id),
                model: gpu.model.clone(),
                wanted: demand.models.clone(),
            }));
        }
        None
    }

    pub(super) fn fit(&self, id: usize, demand: &GpuDemand) -> Fit {
        if let Some(refusal) = self.filter_refusal(id, demand) {
            return refusal;
        }
        match self.capacity_refusal(id, demand.mode, demand.count as usize) {
            Some(reason) => Fit::No(reason),
            None => Fit::Yes(match demand.mode {
                GpuMode::Shared(need) => self.room(id) - need.get(),
                GpuMode::Whole => 0,
            }),
        }
    }

    pub(super) fn too_few(&self, m: usize, fit: usize, needs: u32) -> PendingReason {
        PendingReason::TooFewGpus {
            machine: self.machine(m).name.clone(),
            fit: fit as u32,
            needs,
        }
    }

    /// Why `request` waits: at most [`REASONS_LISTED`] reasons, in the fleet's order, and
    /// [`PendingReason::More`] after them where more GPUs or machines turn it away. The GPUs and machines
    /// it may use come first, those its own rules turn away (another vendor or model) only where they
    /// leave room. A worker on one shared GPU lists the GPUs with the most room (the nearest to
    /// fitting), found from the room index without a walk through the fleet: every write asks again for
    /// every pending worker, and at 10,000 GPUs a reason for each was 10,000 lines, made at each write.
    pub(super) fn reasons(
        &self,
        request: &WorkerRequest,
        demand: &GpuDemand,
    ) -> Vec<PendingReason> {
        let listing = match demand.mode {
            GpuMode::Shared(_) if demand.count == 1 => self.nearest_reasons(request, demand),
            _ => {
                let mut listing = Listing::default();
                self.list_machines(&mut listing, 0..self.machines.len(), request, demand);
                listing
            }
        };
        let (mut reasons, more) = listing.listed();
        if reasons.is_empty() {
            return vec![PendingReason::NoGpuMatches];
        }
        reasons.sort_by_key(|(at, _)| *at);
        let mut reasons: Vec<PendingReason> = reasons.into_iter().map(|(_, r)| r).collect();
        if more {
            reasons.push(PendingReason::More);
        }
        reasons
    }

    /// Why no machine takes `request`, which asks for no GPU: at most [`REASONS_LISTED`] machines' reasons,
    /// in the fleet's order, then [`PendingReason::More`] where more machines turn it away.
    pub(super) fn machine_reasons(&self, request: &WorkerRequest) -> Vec<PendingReason> {
        let mut all = (0..self.machines.len())
            .filter_map(|m| self.machine_refusal(m, request.cpu_cores, request.memory));
        let mut reasons: Vec<PendingReason> = all.by_ref().take(REASONS_LISTED).collect();
        if all.next().is_some() {
            reasons.push(PendingReason::More);
        }
        reasons
    }

    /// The reasons of the GPUs with the most room for a worker on one shared GPU, each with its place in
    /// the fleet (a machine's reason at its first GPU). The GPUs without room in the index (held whole)
    /// and the machines that see every GPU are asked last, where the index holds too few reasons.
    fn nearest_reasons(&self, request: &WorkerRequest, demand: &GpuDemand) -> Listing {
        let mut listing = Listing::default();
        let mut machines_said = std::collections::BTreeSet::new();
        let indexed = self.by_room.iter().rev().map(|&(_, id)| id);
        let unindexed = (0..self.gpus.len()).filter(|&id| {
            matches!(self.gpus[id].hold, Hold::Whole(_))
                && !self.machine(self.gpus[id].machine).all_gpus_visible
        });
        for id in indexed.chain(unindexed) {
            let m = self.gpus[id].machine;
            let reason = match self.machine_refusal(m, request.cpu_cores, request.memory) {
                Some(reason) if machines_said.insert(m) => {
                    Some(((self.machines[m].gpus.start, 0), reason))
                }
                Some(_) => None,
                None => match self.fit(id, demand) {
                    Fit::No(reason) => Some(((id, 0), reason)),
                    Fit::Yes(_) | Fit::NotAsked => None,
                },
            };
            if reason.is_some_and(|(at, reason)| listing.take(at, reason)) {
                return listing;
            }
        }
        let visible = self.all_visible.iter().copied();
        self.list_machines(&mut listing, visible, request, demand);
        listing
    }

    /// Takes into `listing` each reason `machines` have, machine by machine, until it is done.
    fn list_machines(
        &self,
        listing: &mut Listing,
        machines: impl IntoIterator<Item = usize>,
        request: &WorkerRequest,
        demand: &GpuDemand,
    ) {
        for m in machines {
            let at = self.machines[m].gpus.start;
            let reasons = self.machine_choice(m, request, demand).err();
            let mut reasons = reasons.into_iter().flatten().enumerate();
            if reasons.any(|(k, r)| listing.take((at, k), r)) {
                return;
            }
        }
    }
}

/// A reason's place in the fleet: its GPU's flat id, or its machine's first GPU's, then its place among
/// that machine's reasons.
type At = (usize, usize);

/// Reasons gathered nearest first, in two tiers: those of the GPUs and machines the request may use
/// (their room, their holders, CPU cores, memory), and those its own rules turn away, listed only where
/// the first leave room.
#[derive(Default)]
struct Listing {
    near: Vec<(At, PendingReason)>,
    barred: Vec<(At, PendingReason)>,
    /// A reason was left out.
    more: bool,
}

impl Listing {
    /// Takes `reason`, at `at`. Says whether the listing is done: full of reasons of the GPUs
    /// and machines the request may use, and another came.
    fn take(&mut self, at: At, reason: PendingReason) -> bool {
        let tier = if reason.is_barred() {
            &mut self.barred
        } else {
            &mut self.near
        };
        if tier.len() == REASONS_LISTED {
            self.more = true;
            return !reason.is_barred();
        }
        tier.push((at, reason));
        false
    }

    /// What is listed, and whether more was left out.
    fn listed(self) -> (Vec<(At, PendingReason)>, bool) {
        let room = REASONS_LISTED - self.near.len();
        let more = self.more || self.barred.len() > room;
        let mut listed = self.near;
        listed.extend(self.barred.into_iter().take(room));
        (listed, more)
    }
}
