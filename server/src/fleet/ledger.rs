//! The ledger: who holds which GPU, as a pure function of the inventory and the committed state.
//!
//! Everything committed is held, even where a GPU now offers less than its holders take: an engine that
//! runs holds its memory whether or not a new reading leaves room for it. Such a GPU is over-committed; it
//! takes no new work, and [`Ledger::relieve`] says which standalone workers the policy stops. A committed
//! holder that cannot be held at all (its GPU left the inventory) is kept aside with the reason, and its
//! engine does not run.

use super::committed::Committed;
use super::groups::Group;
use placement::holder::{self, Holder, REPLICA_ROOM, TURNS};
use placement::sharing::{Sharing, SharingError};
use placement::{
    group::member_assignments, Assignment, BasisPoints, Bytes, GpuRef, Hold, Inventory, Scheduler,
};
use std::collections::{BTreeMap, BTreeSet};

/// What a group keeps for its on-demand members beside what the loaded ones hold: the largest on-demand
/// share (the verdict checked that much fits), less what the loaded ones hold already (awake, their
/// shares; asleep, what they keep); none when that is nothing.
fn turns(group: &Group) -> Option<BasisPoints> {
    let share = |m: &str| {
        group
            .members
            .iter()
            .find(|s| s.member == m)
            .map(|s| s.share)
    };
    let largest = group.demand.keys().filter_map(|m| share(m)).max()?;
    // A member asleep counts for what it keeps: the rest of its share is the turns room again.
    let loaded: u32 = group
        .running()
        .iter()
        .filter(|s| group.loaded.contains(&s.member))
        .map(|s| s.share.get())
        .sum();
    let left = largest.get().saturating_sub(loaded);
    (left > 0).then_some(BasisPoints(left))
}

/// Who holds for `group`, with what share, on which GPUs: each unit of each member that runs
/// ([`Group::units`]: on each of the group's machines, or a replica on one GPU), and the room its on-demand
/// members take turns in.
fn group_holds(group: &Group) -> Vec<(String, BasisPoints, Vec<GpuRef>)> {
    let mut by_machine: BTreeMap<&str, Vec<GpuRef>> = BTreeMap::new();
    for gpu in &group.gpus {
        by_machine
            .entry(gpu.machine.as_str())
            .or_default()
            .push(gpu.clone());
    }
    let mut holds = Vec::new();
    let mut kept: BTreeSet<&GpuRef> = BTreeSet::new();
    for (member, share) in group.running().into_iter().map(|s| (s.member, s.share)) {
        for (unit, gpus) in group.units(&member) {
            kept.extend(group.gpus.iter().filter(|g| gpus.contains(g)));
            holds.push((unit, share, gpus));
        }
    }
    if let Some(share) = turns(group) {
        for (machine, gpus) in &by_machine {
            kept.extend(gpus.iter());
            holds.push((
                holder::member(&group.name, TURNS, machine),
                share,
                gpus.clone(),
            ));
        }
    }
    // A GPU where no member holds now (the replicas run elsewhere) stays the group's: shared, holding
    // nothing, so that no worker takes it whole.
    if !group.autoscale.is_empty() {
        for (machine, gpus) in &by_machine {
            let free: Vec<GpuRef> = gpus.iter().filter(|g| !kept.contains(g)).cloned().collect();
            if !free.is_empty() {
                holds.push((
                    holder::member(&group.name, REPLICA_ROOM, machine),
                    BasisPoints(0),
                    free,
                ));
            }
        }
    }
    holds
}

/// What a group takes of a GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Takes {
    /// In all.
    pub all: Bytes,
    /// Of that, what its members' engines take: the rest is the room its on-demand members take turns in,
    /// which no engine has allocated.
    pub engines: Bytes,
}

/// The scheduler holding everything committed, and what could not be held.
pub(crate) struct Ledger {
    scheduler: Scheduler,
    /// Committed holders that hold nothing now, each with why.
    unplaced: BTreeMap<String, String>,
}

/// A worker stopped (by the over-commit policy, or as one kept aside whose GPU newer work took), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Eviction {
    /// The worker.
    pub worker: String,
    /// Why, in words: the over-committed GPU, or the GPU newer work took.
    pub reason: String,
}

impl Ledger {
    /// Holds every committed group member that runs (pinned, or on demand and loaded) on each machine of its
    /// group, the room its on-demand members take turns in, and every placed worker, on `inventory`.
    pub(crate) fn build(inventory: Inventory, committed: &Committed) -> Ledger {
        let mut scheduler = Scheduler::new(inventory);
        for (gpu, sharing) in &committed.sharing {
            scheduler.set_sharing(gpu, sharing.mode);
        }
        let unplaced = BTreeMap::new();
        let mut ledger = Ledger {
            scheduler,
            unplaced,
        };
        for group in &committed.groups {
            ledger.hold_group(group);
        }
        for row in &committed.workers {
            if let Some(assignment) = &row.assignment {
                ledger.hold_committed(&row.name, assignment.clone());
            }
        }
        // Why each kept aside cannot be held, as everything is held: as a write that settles by its rows says.
        ledger.hold_aside(committed);
        ledger
    }

    /// Holds every member of `group` that runs (pinned, or on demand and loaded) on each machine of the
    /// group, and the room its on-demand members take turns in; keeps aside, with why, what cannot be.
    /// Says who holds for it.
    pub(crate) fn hold_group(&mut self, group: &Group) -> Vec<String> {
        let holds = group_holds(group);
        let holders = holds.iter().map(|(who, _, _)| who.clone()).collect();
        for (who, share, gpus) in holds {
            let held = member_assignments(self.scheduler.inventory(), &gpus, share)
                .map_err(|e| e.to_string())
                .and_then(|assignments| {
                    assignments.into_iter().try_for_each(|a| {
                        self.scheduler
                            .hold_committed(&who, a)
                            .map_err(|e| e.to_string())
                    })
                });
            if let Err(why) = held {
                self.unplaced.insert(who, why);
            }
        }
        holders
    }

    /// What `group`'s holders ([`Ledger::hold_group`]'s) would take of each of `gpus`, added up: what a
    /// change of plans on those GPUs alone moves, found without building a ledger.
    pub(crate) fn group_takes(&self, group: &Group, gpus: &[GpuRef]) -> BTreeMap<GpuRef, Takes> {
        let mut takes: BTreeMap<GpuRef, Takes> = BTreeMap::new();
        for (who, share, on) in group_holds(group) {
            let turns = Holder::parse(&who).is_turns();
            for assignment in member_assignments(self.inventory(), &on, share).unwrap_or_default() {
                for index in &assignment.gpus {
                    let gpu = GpuRef::new(&assignment.machine, *index);
                    if gpus.contains(&gpu) {
                        let bytes = assignment.shared.unwrap_or_default();
                        let taken = takes.entry(gpu).or_default();
                        taken.all += bytes;
                        if !turns {
                            taken.engines += bytes;
                        }
                    }
                }
            }
        }
        takes
    }

    /// Lets every holder of `group` go ([`Ledger::hold_group`]'s); says who they were.
    pub(crate) fn forget_group(&mut self, group: &Group) -> Vec<String> {
        group_holds(group)
            .into_iter()
            .map(|(who, _, _)| {
                self.forget(&who);
                who
            })
            .collect()
    }

    /// Holds what was committed for `holder`, or keeps it aside with why it cannot be held.
    pub(crate) fn hold_committed(&mut self, holder: &str, assignment: Assignment) {
        if let Err(e) = self.scheduler.hold_committed(holder, assignment) {
            self.unplaced.insert(holder.to_owned(), e.to_string());
        }
    }

    /// Takes a new reading of `machine` in place, where only what its GPUs offer changed
    /// ([`placement::Machine::same_but_readings`]); says whether it was such a reading.
    pub(crate) fn read_again(&mut self, machine: &placement::Machine) -> bool {
        self.scheduler.read_again(machine)
    }

    /// Lets `holder` go: what it held is free, and it is kept aside no more.
    pub(crate) fn forget(&mut self, holder: &str) {
        self.scheduler.release(holder);
        self.unplaced.remove(holder);
    }

    /// Holds again, oldest first, each committed worker kept aside that can be held now (the room another
    /// let go), and says again why each other one cannot, as things are held now (its reason names what
    /// holds its GPUs, which the writes since may have changed). Says which were held or are kept aside
    /// for another reason.
    pub(crate) fn hold_aside(&mut self, committed: &Committed) -> Vec<String> {
        let mut aside: Vec<(i64, &crate::fleet::committed::Worker)> = self
            .unplaced
            .keys()
            .filter_map(|name| Some((committed.workers.seq_of(name)?, committed.worker(name)?)))
            .collect();
        aside.sort_by_key(|(seq, _)| *seq);
        let mut changed = Vec::new();
        for (_, worker) in aside {
            let Some(assignment) = &worker.assignment else {
                continue;
            };
            let why = match self
                .scheduler
                .hold_committed(&worker.name, assignment.clone())
            {
                Ok(()) => {
                    self.unplaced.remove(&worker.name);
                    changed.push(worker.name.clone());
                    continue;
                }
                Err(e) => e.to_string(),
            };
            if self.unplaced.get(&worker.name) != Some(&why) {
                self.unplaced.insert(worker.name.clone(), why);
                changed.push(worker.name.clone());
            }
        }
        changed
    }

    /// The workers kept aside whose GPUs newer workers hold: a rebuild, which holds workers oldest first,
    /// would hold such a one and keep the newer aside, so each gives its claim up and waits to be placed
    /// again (as what ran stays where it ran).
    pub(crate) fn claims_taken(&self, committed: &Committed) -> Vec<Eviction> {
        let mut taken = Vec::new();
        for name in self.unplaced.keys() {
            let (Some(seq), Some(assignment)) = (
                committed.workers.seq_of(name),
                committed.worker(name).and_then(|w| w.assignment.as_ref()),
            ) else {
                continue;
            };
            let newer = |holder: &String| {
                committed
                    .workers
                    .seq_of(holder)
                    .is_some_and(|other| other > seq)
            };
            let by = assignment.gpus.iter().find_map(|&index| {
                let gpu = GpuRef::new(&assignment.machine, index);
                let holder = match self.scheduler.hold(&gpu)? {
                    Hold::Whole(holder) => newer(holder).then_some(holder),
                    Hold::Shared(sharers) => sharers.keys().find(|h| newer(h)),
                    Hold::Free => None,
                }?;
                Some((gpu, holder.clone()))
            });
            if let Some((gpu, holder)) = by {
                taken.push(Eviction {
                    worker: name.clone(),
                    reason: format!(
                        "{gpu} went to {holder} while {name} could not be held there; {name} waits to be placed again"
                    ),
                });
            }
        }
        taken
    }

    /// The over-commit policy: while a GPU's sharers take more than it offers, and have for long enough
    /// (`due`, for a spike of another program's to pass), the newest standalone shared worker on it stops
    /// (it waits again, pending, with the reason). Until then the GPU only takes no new work. Group members
    /// are never stopped here: their plan was committed by an operator, so their GPU stays over-committed,
    /// in sight, and takes no new work until the plan changes or the memory held outside Tessera falls.
    pub(crate) fn relieve(
        &mut self,
        committed: &Committed,
        due: &dyn Fn(&GpuRef) -> bool,
    ) -> Vec<Eviction> {
        let mut evicted = Vec::new();
        loop {
            let overcommitted = self.scheduler.overcommitted();
            let victim = overcommitted
                .into_iter()
                .filter(|o| due(&o.gpu))
                .find_map(|over| {
                    let Some(Hold::Shared(sharers)) = self.scheduler.hold(&over.gpu) else {
                        return None;
                    };
                    committed
                        .workers
                        .iter()
                        .rev()
                        .find(|w| w.assignment.is_some() && sharers.contains_key(&w.name))
                        .map(|w| Eviction {
                            worker: w.name.clone(),
                            reason: over.to_string(),
                        })
                });
            let Some(victim) = victim else {
                return evicted;
            };
            tracing::warn!(
                "{} stops and waits: {}; the newest shared worker goes first",
                victim.worker,
                victim.reason
            );
            self.scheduler.release(&victim.worker);
            evicted.push(victim);
        }
    }

    /// How GPUs' sharing settings refuse what they hold, one line per GPU: an MPS GPU takes at most
    /// [`placement::sharing::MPS_MAX_CLIENTS`] engines, each on that GPU alone, and only an NVIDIA GPU
    /// takes MPS. Checked at every write, whatever it changed (a plan, a deployment, a repack, the setting).
    pub(crate) fn sharing_refusals(&self, committed: &Committed) -> Vec<SharingError> {
        committed
            .sharing
            .iter()
            .filter_map(|(gpu, sharing)| self.sharing_refusal(gpu, sharing.mode))
            .collect()
    }

    /// How sharing `gpu` as `mode` would refuse what it holds now, if it would.
    pub(crate) fn sharing_refusal(&self, gpu: &GpuRef, mode: Sharing) -> Option<SharingError> {
        let scheduler = &self.scheduler;
        let vendor = &scheduler.inventory().gpu(gpu)?.vendor;
        let sharers: Vec<&String> = match scheduler.hold(gpu) {
            Some(Hold::Shared(sharers)) => sharers.keys().collect(),
            _ => Vec::new(),
        };
        if mode == Sharing::Mps {
            let engines: Vec<String> = sharers
                .iter()
                .filter(|who| {
                    scheduler
                        .workers()
                        .get(who.as_str())
                        .is_some_and(|a| a.gpus.len() > 1)
                })
                .map(|who| match Holder::parse(who) {
                    h @ Holder::Member { group, .. } if h.is_turns() => {
                        format!("the on-demand members of {group}")
                    }
                    h => h.name().to_owned(),
                })
                .collect();
            if !engines.is_empty() {
                return Some(SharingError::SeveralGpus {
                    gpu: gpu.to_string(),
                    engines,
                });
            }
        }
        mode.check(&gpu.to_string(), vendor, sharers.len()).err()
    }

    /// Who holds room on `machine`, or would and is kept aside: workers by name, group members as their
    /// holders.
    pub(crate) fn holders_on(&self, machine: &str, committed: &Committed) -> BTreeSet<String> {
        let mut holders: BTreeSet<String> = self
            .scheduler
            .workers()
            .iter()
            .filter(|(_, a)| a.machine == machine)
            .map(|(holder, _)| holder.clone())
            .collect();
        holders.extend(
            self.unplaced
                .keys()
                .filter(|holder| match Holder::parse(holder) {
                    Holder::Member { machine: on, .. } => on == machine,
                    Holder::Worker(name) => committed
                        .worker(name)
                        .and_then(|w| w.assignment.as_ref())
                        .is_some_and(|a| a.machine == machine),
                })
                .cloned(),
        );
        holders
    }

    /// Shares `gpu` as `mode` from now on (what it takes next; what it holds stays).
    pub(crate) fn set_sharing(&mut self, gpu: &GpuRef, mode: Sharing) {
        self.scheduler.set_sharing(gpu, mode);
    }

    /// Who holds `gpu`: a worker by name, a group member as its holder.
    pub(crate) fn holders_of(&self, gpu: &GpuRef) -> Vec<String> {
        match self.scheduler.hold(gpu) {
            Some(Hold::Shared(sharers)) => sharers.keys().cloned().collect(),
            Some(Hold::Whole(holder)) => vec![holder.clone()],
            Some(Hold::Free) | None => Vec::new(),
        }
    }

    /// The inventory it holds on.
    pub(crate) fn inventory(&self) -> &Inventory {
        self.scheduler.inventory()
    }

    /// The scheduler, to decide new work with.
    pub(crate) fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Holds a new decision.
    pub(crate) fn hold(&mut self, holder: &str, assignment: Assignment) -> Result<(), String> {
        self.scheduler
            .hold_for(holder, assignment)
            .map_err(|e| e.to_string())
    }

    /// Why a committed holder holds nothing now, if it does not.
    pub(crate) fn unplaced(&self, holder: &str) -> Option<&str> {
        self.unplaced.get(holder).map(String::as_str)
    }

    /// Every committed holder that holds nothing now, and why.
    pub(crate) fn all_unplaced(&self) -> &BTreeMap<String, String> {
        &self.unplaced
    }
}
