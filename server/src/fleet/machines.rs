//! Machines: what each GPU offers, who holds it, and whether its holders take more than it offers; fresh
//! readings of this machine's GPUs; the read views published after every write.

use super::authority::Sight;
use super::committed::Committed;
use super::engines;
use super::ledger::Ledger;
use super::workers::{redact_worker, view, WorkerView};
use super::{Fleet, Views};
use crate::error::ApiError;
use crate::inventory::GpuLive;
use crate::inventory::LocalGpus;
use placement::holder::Holder;
use placement::sharing::GpuSharing;
use placement::{GpuRef, Hold, Machine, Overcommit};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

impl Views {
    /// Every read view of `committed` as `ledger` holds it.
    pub(super) fn of(committed: &Arc<Committed>, ledger: &Ledger) -> Views {
        let workers: imbl::OrdMap<i64, Arc<WorkerView>> = committed
            .workers
            .iter()
            .map(|w| (w.seq, Arc::new(view(w, ledger))))
            .collect();
        let mut on_machine: imbl::OrdMap<String, imbl::OrdSet<i64>> = ledger
            .inventory()
            .machines()
            .iter()
            .map(|m| (m.name.clone(), imbl::OrdSet::new()))
            .collect();
        for (seq, worker) in &workers {
            if let Some(list) = worker.machine.as_ref().and_then(|m| on_machine.get_mut(m)) {
                list.insert(*seq);
            }
        }
        let mut views = Views {
            workers,
            on_machine,
            by_machine: imbl::OrdMap::new(),
            by_machine_redacted: imbl::OrdMap::new(),
            machines: Vec::new(),
            committed: committed.clone(),
            unplaced: ledger.all_unplaced().clone(),
        };
        for machine in ledger.inventory().machines() {
            views.serialize_machine(&machine.name);
        }
        let overcommitted = ledger.scheduler().overcommitted();
        views.machines = ledger
            .inventory()
            .machines()
            .iter()
            .map(|m| Arc::new(machine_view(committed, ledger, &overcommitted, m)))
            .collect();
        views
    }

    /// Serializes the workers on `machine` again, as the API answers them.
    pub(super) fn serialize_machine(&mut self, machine: &str) {
        let here: Vec<&Arc<WorkerView>> = self
            .on_machine
            .get(machine)
            .into_iter()
            .flatten()
            .filter_map(|seq| self.workers.get(seq))
            .collect();
        let (json, redacted) = machine_workers(&self.committed, &here);
        self.by_machine.insert(machine.to_owned(), json);
        self.by_machine_redacted
            .insert(machine.to_owned(), redacted);
    }
}

/// A machine read again, whose new reading the ledger has taken.
pub(crate) enum Reading {
    /// What its GPUs offer changed (what other programs hold, their health): taken in place.
    Offers(String),
    /// Its GPUs came, went or were cut: the ledger was held anew on the new inventory from the committed
    /// state, and these holders held or hold there.
    Reshaped(String, BTreeSet<String>),
}

impl Fleet {
    /// Each machine with its GPUs, what they offer and who holds them.
    pub fn machines(&self) -> Vec<MachineView> {
        let mut machines: Vec<MachineView> = self
            .views()
            .machines
            .iter()
            .map(|m| MachineView::clone(m))
            .collect();
        for machine in &mut machines {
            machine.unreachable_since = self.unreachable_since(&machine.name);
            self.with_measured(machine);
        }
        machines
    }

    /// Keeps what each of Tessera's engines on `machine` (`running`: each engine's unit and PIDs) was
    /// measured to hold on each GPU at this reading: what the driver reports for its processes; where it
    /// ties nothing to an engine's processes on a GPU of the reading (its memory held by an MPS server, its
    /// processes in a container of their own), what the engine `reported` it allocated there, if it did.
    /// Where the driver gives no per-process figure (WSL2) and the engine no report, nothing is kept, and
    /// nothing is judged. Keeps too why each GPU the reading found unhealthy is so.
    pub(crate) fn measure(
        &self,
        machine: &str,
        live: &[GpuLive],
        running: &[(String, Vec<u32>)],
        reported: &[(String, Vec<(u32, placement::Bytes)>)],
    ) {
        {
            let mut problems = self
                .problems
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            problems.retain(|(m, _), _| m != machine);
            for gpu in live {
                if let Some(problem) = &gpu.problem {
                    problems.insert((machine.to_owned(), gpu.index), problem.clone());
                }
            }
        }
        let mut measured = self
            .measured
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        measured.retain(|(m, _, _), _| m != machine);
        for gpu in live {
            for (unit, pids) in running {
                let used: placement::Bytes = gpu
                    .processes
                    .iter()
                    .filter(|(pid, _)| pids.contains(pid))
                    .map(|&(_, bytes)| bytes)
                    .sum();
                if used > placement::Bytes::ZERO {
                    measured.insert((machine.to_owned(), gpu.index, unit.clone()), used);
                }
            }
            for (unit, per_gpu) in reported {
                let key = (machine.to_owned(), gpu.index, unit.clone());
                let said = per_gpu.iter().find(|(index, _)| *index == gpu.index);
                if let (Some(&(_, bytes)), false) = (said, measured.contains_key(&key)) {
                    measured.insert(key, bytes);
                }
            }
        }
    }

    /// `machine`'s sharers with what each was last measured to hold, and the line for those that hold more
    /// than their share: on a time-sliced GPU a share is a promise the engine keeps by sizing itself.
    fn with_measured(&self, machine: &mut MachineView) {
        let measured = self
            .measured
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let problems = self
            .problems
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let name = machine.name.clone();
        for gpu in &mut machine.gpus {
            gpu.problem = problems.get(&(name.clone(), gpu.index)).cloned();
            let here = GpuRef::new(&name, gpu.index).to_string();
            for sharer in &mut gpu.sharers {
                // A member's engine there is its unit on the machine, or its replica on this GPU.
                let holders = match &sharer.group {
                    Some(group) => vec![
                        placement::holder::member(group, &sharer.worker, &name),
                        placement::holder::replica(
                            group,
                            &sharer.worker,
                            &GpuRef::new(&name, gpu.index),
                        ),
                    ],
                    None => vec![sharer.worker.clone()],
                };
                if let Some(&used) = holders
                    .into_iter()
                    .find_map(|h| measured.get(&(name.clone(), gpu.index, h)))
                {
                    sharer.measured_bytes = Some(used.get());
                    sharer.over_share = placement::sharing::over_share(
                        &sharer.worker,
                        &here,
                        used,
                        placement::Bytes(sharer.bytes),
                    );
                }
            }
        }
    }

    /// Why each worker or sharing group's model flagged as using more than its share is, by name (the
    /// first GPU where it is): read in one pass over the machines, for every row of a page at once.
    pub fn over_shares(&self) -> std::collections::BTreeMap<String, String> {
        let mut over = std::collections::BTreeMap::new();
        for sharer in self
            .machines()
            .into_iter()
            .flat_map(|m| m.gpus)
            .flat_map(|g| g.sharers)
        {
            if let Some(line) = sharer.over_share {
                over.entry(sharer.worker).or_insert(line);
            }
        }
        over
    }

    /// One machine.
    pub fn machine(&self, name: &str) -> Result<MachineView, ApiError> {
        let mut machine = self
            .views()
            .machines
            .iter()
            .find(|m| m.name == name)
            .map(|m| MachineView::clone(m))
            .ok_or_else(|| no_machine(name))?;
        machine.unreachable_since = self.unreachable_since(name);
        self.with_measured(&mut machine);
        Ok(machine)
    }

    /// Why work on `machine` waits while its node is unreachable, where it is: what the machine page says.
    pub(super) fn unreachable_words(&self, machine: &str) -> Option<String> {
        let since = self.unreachable_since(machine)?;
        Some(format!(
            "{machine} is unreachable since {since}: its Ray node is dead or gone, or the cluster does not answer"
        ))
    }

    /// `why` a holder waits or is not held, said as the unreachable machine it names where it names one:
    /// the GPUs of such a machine are out of the inventory, which alone would say they are not there.
    pub(super) fn said_of_unreachable(&self, why: String, machines: &[&str]) -> String {
        machines
            .iter()
            .find_map(|m| {
                let gone = why == placement::PendingReason::NoGpuMatches.to_string()
                    || why.ends_with(&format!(" of {m} is not in the inventory"));
                gone.then(|| self.unreachable_words(m)).flatten()
            })
            .unwrap_or(why)
    }

    /// Whether every machine is reachable (always, without a Ray cluster): most reads say nothing more.
    pub(super) fn nothing_unreachable(&self) -> bool {
        self.unreachable
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_empty()
    }

    fn unreachable_since(&self, name: &str) -> Option<String> {
        self.unreachable
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// The workers placed on one machine, as a JSON array, with their secrets if `sight` allows.
    pub fn machine_workers(&self, name: &str, sight: Sight) -> Result<axum::body::Bytes, ApiError> {
        let views = self.views();
        match sight {
            Sight::Secrets => &views.by_machine,
            Sight::Redacted => &views.by_machine_redacted,
        }
        .get(name)
        .cloned()
        .ok_or_else(|| no_machine(name))
    }

    /// Takes a fresh reading of one machine (this machine's GPUs through NVML): what its GPUs offer may
    /// have changed. A GPU whose holders now take more than it offers is over-committed (the policy of
    /// [`Ledger::relieve`] decides what stops); pending work that fits now is placed, oldest first.
    pub async fn refresh_machine(self: &Arc<Self>, machine: Machine) -> Result<(), ApiError> {
        self.refresh(machine, None).await
    }

    /// [`Fleet::refresh_machine`] for a reading of this machine taken at `generation`: dropped where a cut
    /// or a join of its GPUs began or ended since, and marked where one is under way.
    async fn refresh(
        self: &Arc<Self>,
        machine: Machine,
        generation: Option<u64>,
    ) -> Result<(), ApiError> {
        self.write(|fleet| async move {
            let mut state = fleet.state.lock().await;
            if let Some(generation) = generation {
                if fleet
                    .local_generation
                    .load(std::sync::atomic::Ordering::SeqCst)
                    != generation
                {
                    return Ok(());
                }
            }
            let machine = fleet.marked(machine);
            let inventory = state.ledger.inventory();
            // The same reading changes nothing, unless a GPU of the machine has now been over-committed
            // for long enough that the over-commit policy stops work there.
            let now = super::usage::now_ms();
            let grace = fleet.runtime.evict_after();
            let eviction_due = state
                .over_since
                .keys()
                .any(|gpu| gpu.machine == machine.name && state.eviction_due(gpu, now, grace));
            if inventory.machine(&machine.name) == Some(&machine) && !eviction_due {
                return Ok(());
            }
            // Only what its GPUs offer changed (what other programs hold, their health): taken into the
            // ledger in place, and settled by what it touched. Anything else builds it anew.
            let before = inventory.machine(&machine.name).cloned();
            let name = machine.name.clone();
            if let Some(before) = before.filter(|b| b.same_but_readings(&machine)) {
                let tx = crate::db::write(&fleet.pool).await?;
                state.ledger.read_again(&machine);
                let read = Reading::Offers(name);
                let settled = fleet
                    .finish_with(&mut state, tx, None, Some(&read), None)
                    .await;
                if settled.is_err() {
                    // The state before the reading stands: so does its reading.
                    state.ledger.read_again(&before);
                }
                return settled;
            }
            let inventory = inventory
                .with_machine(machine)
                .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
            let tx = crate::db::write(&fleet.pool).await?;
            // Its GPUs came, went or were cut, or it is new to the fleet.
            fleet.finish_reshaped(&mut state, tx, inventory, name).await
        })
        .await
    }

    /// Settles a write that changed the GPUs of `machine` (a reading, a cut, a join) onto `inventory`: the
    /// ledger is held anew from what is committed (the database is not read again), and the write settled
    /// by what held on that machine before and holds there now, as a write settled by its rows is. Where it
    /// fails, the ledger before it stands.
    pub(super) async fn finish_reshaped(
        &self,
        state: &mut super::State,
        tx: sqlx::Transaction<'static, sqlx::Sqlite>,
        inventory: placement::Inventory,
        machine: String,
    ) -> Result<(), ApiError> {
        let mut holders = state.ledger.holders_on(&machine, &state.committed);
        let anew = Ledger::build(inventory, &state.committed);
        let was = std::mem::replace(&mut state.ledger, anew);
        holders.extend(state.ledger.holders_on(&machine, &state.committed));
        let read = Reading::Reshaped(machine, holders);
        let settled = self.finish_with(state, tx, None, Some(&read), None).await;
        if settled.is_err() {
            state.ledger = was;
        }
        settled
    }

    /// Reads this machine's GPUs every `every` for as long as the server runs. A failed reading is logged
    /// once until the next good one, and the last good reading stands meanwhile.
    pub async fn follow_local_gpus(
        self: Arc<Self>,
        gpus: Arc<dyn LocalGpus>,
        every: std::time::Duration,
    ) {
        let mut last_error = None;
        loop {
            tokio::time::sleep(every).await;
            let generation = self
                .local_generation
                .load(std::sync::atomic::Ordering::SeqCst);
            let reader = gpus.clone();
            let running = self.runtime.running().await;
            let ours = {
                let state = self.state.lock().await;
                let hosts = self.hosts();
                let local = hosts.local.as_deref().unwrap_or_default();
                engines::ours(&state.ledger, local, &running)
            };
            let reading =
                tokio::task::spawn_blocking(move || reader.read(&ours).map_err(|e| e.to_string()))
                    .await;
            let outcome = match reading {
                Ok(Ok(reading)) => {
                    let reported = self.runtime.reported_on(&reading.machine.name);
                    self.measure(&reading.machine.name, &reading.live, &running, &reported);
                    let at = super::usage::now_ms();
                    match self
                        .record_samples(&reading.machine, &reading.live, at)
                        .await
                    {
                        Ok(()) => self.refresh(reading.machine, Some(generation)).await,
                        Err(e) => Err(e),
                    }
                    .map_err(|e| e.to_string())
                }
                Ok(Err(e)) => Err(e),
                Err(e) => Err(e.to_string()),
            };
            match outcome {
                Ok(()) => last_error = None,
                Err(e) if last_error.as_ref() != Some(&e) => {
                    tracing::warn!("this machine's GPUs could not be read again: {e}");
                    last_error = Some(e);
                }
                Err(_) => {}
            }
        }
    }
}

fn no_machine(name: &str) -> ApiError {
    ApiError::NotFound(format!(
        "there is no machine named {name}; GET /api/machines lists them"
    ))
}

/// A machine as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineView {
    /// Its name.
    pub name: String,
    /// CPU cores, and those workers hold.
    pub cpu_cores: u32,
    /// CPU cores held by workers.
    pub cpu_cores_used: u32,
    /// Memory, GB.
    pub memory_gb: f64,
    /// Memory held by workers, GB.
    pub memory_gb_used: f64,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// Memory held by workers, bytes.
    pub memory_bytes_used: u64,
    /// A Windows PC under WSL2.
    pub all_gpus_visible: bool,
    /// Its GPUs.
    pub gpus: Vec<GpuView>,
    /// Since when (RFC 3339) the Ray node of a cluster's machine has been dead or gone: its GPUs are out of
    /// the inventory meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable_since: Option<String>,
}

/// A GPU as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    /// Index on its machine.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Model name.
    pub model: String,
    /// Vendor.
    pub vendor: String,
    /// Healthy or not.
    pub healthy: bool,
    /// All its memory, GB.
    pub total_gb: f64,
    /// All its memory, bytes.
    pub total_bytes: u64,
    /// What it offers Tessera, GB.
    pub offered_gb: f64,
    /// What it offers Tessera, bytes.
    pub offered_bytes: u64,
    /// Held outside Tessera, GB.
    pub held_outside_gb: f64,
    /// Held outside Tessera, bytes.
    pub held_outside_bytes: u64,
    /// `free`, `whole` or `shared`.
    pub mode: String,
    /// The worker holding it whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// Its sharers and the GB each takes.
    pub sharers: Vec<SharerView>,
    /// GB its sharers take.
    pub taken_gb: f64,
    /// Bytes its sharers take.
    pub taken_bytes: u64,
    /// When its sharers take more than it offers (what it holds outside Tessera grew), in words; it takes
    /// no new work meanwhile.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub overcommitted: Option<String>,
    /// The machine page's line: `shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// How it is shared (`PUT /api/machines/{name}/gpus/{index}/sharing` sets it).
    #[serde(default)]
    pub sharing: GpuSharing,
    /// Its part in MIG: cut into instances (`{"role": "cut"}`), or an instance of the GPU it names.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub mig: Option<placement::MigRole>,
    /// Why the last reading found it unhealthy, where it did and said why.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub problem: Option<String>,
}

/// One sharer of a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharerView {
    /// The worker, or the model of a sharing group.
    pub worker: String,
    /// The sharing group, for a group's member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The GB it takes.
    pub gb: f64,
    /// The bytes it takes.
    pub bytes: u64,
    /// What its engine was last measured to hold here, where the driver reports it per process.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub measured_bytes: Option<u64>,
    /// When it holds more than its share, in words: a promise broken.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub over_share: Option<String>,
}

pub(super) fn machine_view(
    committed: &Committed,
    ledger: &Ledger,
    overcommitted: &[Overcommit],
    machine: &placement::Machine,
) -> MachineView {
    let scheduler = ledger.scheduler();
    let (cpu_used, memory_used) = scheduler.machine_use(&machine.name).unwrap_or_default();
    MachineView {
        name: machine.name.clone(),
        cpu_cores: machine.cpu_cores,
        cpu_cores_used: cpu_used,
        memory_gb: machine.memory.as_gb_f64(),
        memory_gb_used: memory_used.as_gb_f64(),
        memory_bytes: machine.memory.get(),
        memory_bytes_used: memory_used.get(),
        all_gpus_visible: machine.all_gpus_visible,
        gpus: machine
            .gpus
            .iter()
            .map(|gpu| {
                let here = GpuRef::new(&machine.name, gpu.index);
                let hold = scheduler.hold(&here).cloned().unwrap_or(Hold::Free);
                let (mode, held_by, sharers) = match &hold {
                    Hold::Free => ("free", None, BTreeMap::new()),
                    Hold::Whole(w) => ("whole", Some(w.clone()), BTreeMap::new()),
                    Hold::Shared(s) => ("shared", None, s.clone()),
                };
                let summary = (!sharers.is_empty()).then(|| {
                    let list: Vec<String> = sharers
                        .iter()
                        .map(|(w, b)| format!("{} {b}", Holder::parse(w).name()))
                        .collect();
                    format!("shared: {} — {} taken", list.join(", "), hold.taken())
                });
                GpuView {
                    index: gpu.index,
                    uuid: gpu.uuid.clone(),
                    model: gpu.model.clone(),
                    vendor: gpu.vendor.clone(),
                    healthy: gpu.healthy,
                    total_gb: gpu.total.as_gb_f64(),
                    total_bytes: gpu.total.get(),
                    offered_gb: gpu.offered().as_gb_f64(),
                    offered_bytes: gpu.offered().get(),
                    held_outside_gb: gpu.held_outside.as_gb_f64(),
                    held_outside_bytes: gpu.held_outside.get(),
                    mode: mode.to_owned(),
                    held_by,
                    sharers: sharers
                        .iter()
                        .map(|(w, b)| {
                            let holder = Holder::parse(w);
                            SharerView {
                                worker: holder.name().to_owned(),
                                group: holder.group().map(str::to_owned),
                                gb: b.as_gb_f64(),
                                bytes: b.get(),
                                measured_bytes: None,
                                over_share: None,
                            }
                        })
                        .collect(),
                    taken_gb: hold.taken().as_gb_f64(),
                    taken_bytes: hold.taken().get(),
                    overcommitted: overcommitted
                        .iter()
                        .find(|o| o.gpu == here)
                        .map(ToString::to_string),
                    summary,
                    sharing: committed.sharing(&here),
                    mig: gpu.mig.clone(),
                    problem: None,
                }
            })
            .collect(),
        unreachable_since: None,
    }
}

/// The workers on a machine as the API's answer: as they are, and with secrets redacted. Serializing
/// plain data into a Vec cannot fail.
pub(super) fn machine_workers(
    committed: &Committed,
    workers: &[&Arc<WorkerView>],
) -> (axum::body::Bytes, axum::body::Bytes) {
    let shown: Vec<WorkerView> = workers
        .iter()
        .map(|w| redact_worker(committed, WorkerView::clone(w)))
        .collect();
    (
        serde_json::to_vec(workers).unwrap_or_default().into(),
        serde_json::to_vec(&shown).unwrap_or_default().into(),
    )
}
