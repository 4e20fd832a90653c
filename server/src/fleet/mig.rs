//! Cutting a GPU into MIG instances and joining it back (seed 004): a change of the GPUs themselves, made
//! only while nothing runs on the GPU or its instances.
//!
//! A made-up GPU of the demo fleet is cut in the inventory alone, in one write. One of this machine's is cut
//! through `nvidia-smi`, which can take its time, so in three steps: a write marks the GPU as being cut
//! (cut, without instances: nothing is placed there meanwhile, and readings of the machine are marked the
//! same way); `nvidia-smi` runs outside the write lock, so that other writes go on; a last write reads the
//! machine afresh, stores what was done (or, where a cut failed and was undone, that the GPU is whole), and
//! installs it. A reading taken before that last write is dropped rather than installed after it.

use super::{Fleet, State};
use crate::error::ApiError;
use crate::runtime::spec::Host;
use crate::runtime::EngineState;
use app::views::SharingChange;
use placement::holder::Holder;
use placement::mig::Layout;
use placement::sharing::{GpuSharing, Sharing, SharingError};
use placement::{GpuRef, Hold, Inventory, Machine, MigRole};
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A cut (or, without a layout, a join) of one of this machine's GPUs: decided and marked under the write
/// lock, carried out after it.
pub(super) struct LocalChange {
    gpu: GpuRef,
    sharing: GpuSharing,
    layout: Option<Layout>,
    before: GpuSharing,
    cut_before: Option<Vec<String>>,
    actor: String,
}

/// What a sharing write leads to.
pub(super) enum Written {
    /// Done and committed.
    Done(SharingChange),
    /// One of this machine's GPUs to cut or join, marked as such and not yet done.
    Local(LocalChange),
}

impl Fleet {
    /// Cuts `gpu` into `layout`'s instances, or joins it back whole where there is none (`sharing` is then
    /// what it is shared as). Called under the write lock, with the sharing setting's own refusals passed.
    pub(super) async fn change_mig(
        &self,
        state: &mut State,
        gpu: GpuRef,
        host: Host,
        sharing: GpuSharing,
        layout: Option<Layout>,
        actor: &str,
    ) -> Result<Written, ApiError> {
        if self.cutting(&gpu) {
            return Err(ApiError::Conflict(format!(
                "{gpu} is being cut into MIG instances or joined back; wait until that is done"
            )));
        }
        self.check_idle(state, &gpu)?;
        let before = state.committed.sharing(&gpu);
        let cut_before = state.committed.mig.get(&gpu).cloned();
        let inventory = state.ledger.inventory().clone();
        let machine = inventory
            .machine(&gpu.machine)
            .ok_or_else(|| ApiError::NotFound(format!("there is no machine {}", gpu.machine)))?;
        match host {
            Host::Simulated => {
                let machine = match &layout {
                    Some(layout) => crate::inventory::demo::cut(machine, gpu.index, layout),
                    None => crate::inventory::demo::join(machine, gpu.index),
                };
                let inventory = inventory
                    .with_machine(machine)
                    .map_err(ApiError::internal)?;
                let mut tx = crate::db::write(&self.pool).await?;
                let change = record(&mut tx, &gpu, sharing, layout.as_ref(), before, cut_before, actor).await?;
                self.finish_reshaped(state, tx, inventory, gpu.machine.clone())
                    .await?;
                Ok(Written::Done(change))
            }
            Host::Local if self.runtime.local_gpus().is_some() => {
                self.mig_busy
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(gpu.clone());
                self.local_generation.fetch_add(1, Ordering::SeqCst);
                let marked = self.marked(machine.clone());
                let inventory = inventory.with_machine(marked).map_err(ApiError::internal)?;
                let tx = crate::db::write(&self.pool).await?;
                if let Err(e) = self
                    .finish_reshaped(state, tx, inventory, gpu.machine.clone())
                    .await
                {
                    self.unmark(&gpu);
                    return Err(e);
                }
                Ok(Written::Local(LocalChange {
                    gpu,
                    sharing,
                    layout,
                    before,
                    cut_before,
                    actor: actor.to_owned(),
                }))
            }
            Host::Local => Err(ApiError::Unprocessable(format!(
                "{gpu}: NVML reads no GPUs here, so Tessera can neither cut this machine's GPU nor see its instances"
            ))),
            Host::Remote | Host::Cluster { .. } => Err(ApiError::Unprocessable(
                SharingError::NoMigThere {
                    gpu: gpu.to_string(),
                    machine: gpu.machine.clone(),
                }
                .to_string(),
            )),
        }
    }

    /// Carries out a cut or a join marked by [`Fleet::change_mig`]: `nvidia-smi` outside the write lock,
    /// then a write that reads the machine afresh and stores what was done.
    pub(super) async fn carry_out(
        self: &Arc<Self>,
        change: LocalChange,
    ) -> Result<SharingChange, ApiError> {
        let nvidia_smi = self.runtime.nvidia_smi();
        let done = match &change.layout {
            Some(layout) => nvidia_smi.cut(change.gpu.index, layout).await,
            None => nvidia_smi.join(change.gpu.index).await,
        };
        self.write(|fleet| async move { fleet.end_change(change, done).await })
            .await
    }

    async fn end_change(
        &self,
        change: LocalChange,
        done: Result<(), String>,
    ) -> Result<SharingChange, ApiError> {
        let mut state = self.state.lock().await;
        self.unmark(&change.gpu);
        let inventory = self
            .read_local(&state, state.ledger.inventory().clone())
            .await;
        let mut tx = crate::db::write(&self.pool).await?;
        let LocalChange {
            gpu,
            sharing,
            layout,
            before,
            cut_before,
            actor,
        } = change;
        let outcome = match done {
            Ok(()) => Ok(record(
                &mut tx,
                &gpu,
                sharing,
                layout.as_ref(),
                before,
                cut_before,
                &actor,
            )
            .await?),
            Err(why) => {
                // A cut that failed was undone: where the GPU now reads whole, it is stored as whole.
                let whole = inventory.gpu(&gpu).is_some_and(|g| g.mig.is_none());
                if whole && before.mode == Sharing::Mig {
                    record(
                        &mut tx,
                        &gpu,
                        GpuSharing::default(),
                        None,
                        before,
                        cut_before,
                        &actor,
                    )
                    .await?;
                }
                Err(ApiError::Conflict(format!(
                    "{gpu} could not be {}: {why}",
                    if layout.is_some() {
                        "cut"
                    } else {
                        "joined back"
                    }
                )))
            }
        };
        self.finish_reshaped(&mut state, tx, inventory, gpu.machine.clone())
            .await?;
        outcome
    }

    /// Cuts again, in the background, each GPU of this machine stored as cut whose MIG mode is still on but
    /// whose instances the driver no longer lists: instances do not outlive a reboot or a driver reload,
    /// while MIG mode does. A GPU whose MIG mode was turned off is left as it is. Each outcome is logged.
    pub async fn recut_after_restart(self: Arc<Self>) {
        let Some(local) = self.hosts().local.clone() else {
            return;
        };
        let lost: Vec<(GpuRef, Vec<String>)> = {
            let state = self.state.lock().await;
            let inventory = state.ledger.inventory();
            state
                .committed
                .mig
                .iter()
                .filter(|(gpu, _)| gpu.machine == local)
                .filter(|(gpu, _)| {
                    inventory
                        .gpu(gpu)
                        .is_some_and(|g| g.mig == Some(MigRole::Cut))
                        && !listed_instances(inventory, gpu)
                })
                .map(|(gpu, profiles)| (gpu.clone(), profiles.clone()))
                .collect()
        };
        for (gpu, profiles) in lost {
            let fleet = self.clone();
            let again = gpu.clone();
            let marked = self
                .write(|fleet| async move {
                    let mut state = fleet.state.lock().await;
                    let model = state
                        .ledger
                        .inventory()
                        .gpu(&again)
                        .map(|g| g.model.clone())
                        .unwrap_or_default();
                    let layout = placement::mig::layout_for(&model, &profiles)
                        .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
                    let sharing = state.committed.sharing(&again);
                    fleet
                        .change_mig(
                            &mut state,
                            again,
                            Host::Local,
                            sharing,
                            Some(layout),
                            crate::audit::TESSERA,
                        )
                        .await
                })
                .await;
            let outcome = match marked {
                Ok(Written::Local(change)) => fleet.carry_out(change).await.map(drop),
                Ok(Written::Done(_)) => Ok(()),
                Err(e) => Err(e),
            };
            match outcome {
                Ok(()) => tracing::info!(
                    "{gpu} was cut into MIG instances again as stored: the driver listed none of them"
                ),
                Err(e) => tracing::warn!(
                    "{gpu} is stored as cut into MIG instances, which the driver does not list, and could not be cut again: {e}"
                ),
            }
        }
    }

    /// Whether `gpu` is being cut or joined back now.
    fn cutting(&self, gpu: &GpuRef) -> bool {
        self.mig_busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(gpu)
    }

    fn unmark(&self, gpu: &GpuRef) {
        self.mig_busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(gpu);
        self.local_generation.fetch_add(1, Ordering::SeqCst);
    }

    /// `machine` with each of its GPUs being cut or joined marked so: cut, without instances, so that
    /// nothing is placed on it or them until it is done.
    pub(super) fn marked(&self, mut machine: Machine) -> Machine {
        let busy = self
            .mig_busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for gpu in busy.iter().filter(|g| g.machine == machine.name) {
            machine.gpus.retain(|g| !g.is_instance_of(gpu.index));
            for g in machine.gpus.iter_mut().filter(|g| g.index == gpu.index) {
                g.mig = Some(MigRole::Cut);
            }
        }
        machine
    }

    /// Refuses a cut or a join of `gpu` while anything is committed to run on it or its instances.
    fn check_idle(&self, state: &State, gpu: &GpuRef) -> Result<(), ApiError> {
        let inventory = state.ledger.inventory();
        let mut running = BTreeSet::new();
        // The GPU and its instances, by index.
        let on_it: BTreeSet<u32> = inventory
            .machine(&gpu.machine)
            .into_iter()
            .flat_map(|m| m.gpus.iter())
            .filter(|g| g.index == gpu.index || g.is_instance_of(gpu.index))
            .map(|g| g.index)
            .collect();
        for &index in &on_it {
            match state
                .ledger
                .scheduler()
                .hold(&GpuRef::new(&gpu.machine, index))
            {
                Some(Hold::Whole(by)) => {
                    running.insert(Holder::parse(by).name().to_owned());
                }
                // A group's room for its on-demand members is named by its group.
                Some(Hold::Shared(sharers)) => {
                    running.extend(sharers.keys().map(|unit| match Holder::parse(unit) {
                        h @ Holder::Member { group, .. } if h.is_turns() => {
                            format!("group {group}'s on-demand models")
                        }
                        h => h.name().to_owned(),
                    }))
                }
                Some(Hold::Free) | None => {}
            }
        }
        // On this machine's real GPUs, an engine let go but still stopping holds its memory, and the
        // driver would refuse to cut under it.
        if self.hosts().local.as_deref() == Some(gpu.machine.as_str()) {
            let stopping: Vec<String> = self
                .runtime
                .engines()
                .into_iter()
                .filter(|e| e.machine == gpu.machine && e.gpus.iter().any(|i| on_it.contains(i)))
                .filter(|e| !matches!(e.state, EngineState::Stopped | EngineState::Failed))
                .map(|e| e.model.or(e.worker).unwrap_or(e.unit))
                .filter(|name| !running.contains(name))
                .map(|name| format!("{name}, whose engine has not stopped yet"))
                .collect();
            running.extend(stopping);
        }
        if running.is_empty() {
            Ok(())
        } else {
            Err(ApiError::Conflict(
                SharingError::MigBusy {
                    gpu: gpu.to_string(),
                    engines: running.into_iter().collect(),
                }
                .to_string(),
            ))
        }
    }

    /// `inventory` with this machine as NVML reads it now; as it was where the reading fails (the next
    /// reading brings the change).
    async fn read_local(&self, state: &State, inventory: Inventory) -> Inventory {
        let Some(gpus) = self.runtime.local_gpus() else {
            return inventory;
        };
        let hosts = self.hosts();
        let local = hosts.local.as_deref().unwrap_or_default();
        let ours = super::engines::ours(&state.ledger, local, &self.runtime.running().await);
        match super::read_local(&gpus, ours, &inventory).await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!("this machine's GPUs could not be read after a MIG change: {e}");
                inventory
            }
        }
    }
}

/// Whether the driver lists any MIG instance of `gpu`.
fn listed_instances(inventory: &Inventory, gpu: &GpuRef) -> bool {
    inventory
        .machine(&gpu.machine)
        .is_some_and(|m| m.gpus.iter().any(|g| g.is_instance_of(gpu.index)))
}

/// Stores that `gpu` is shared as `sharing` (cut into `layout` under MIG), with an audit entry where that
/// changes what was stored; answers the console's line for it.
async fn record(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    gpu: &GpuRef,
    sharing: GpuSharing,
    layout: Option<&Layout>,
    before: GpuSharing,
    cut_before: Option<Vec<String>>,
    actor: &str,
) -> Result<SharingChange, ApiError> {
    let profiles = layout.map(Layout::profiles);
    super::committed::store_sharing(tx, gpu, sharing, profiles.as_deref()).await?;
    if (before, &cut_before) != (sharing, &profiles) {
        crate::audit::record(
            tx,
            crate::audit::Entry::new(actor, "gpu.sharing", &gpu.id())
                .before(serde_json::json!({ "sharing": before, "instances": cut_before }))
                .after(serde_json::json!({ "sharing": sharing, "instances": profiles })),
        )
        .await?;
    }
    Ok(SharingChange {
        gpu: gpu.id(),
        sharing,
        restarts: Vec::new(),
    })
}

/// `inventory` with each made-up GPU of the demo fleet cut as committed: its instances exist nowhere else.
pub(super) fn cut_made_up(
    mut inventory: Inventory,
    committed: &super::Committed,
    hosts: &crate::runtime::Hosts,
) -> Inventory {
    for (gpu, profiles) in &committed.mig {
        if !matches!(hosts.host(&gpu.machine), Host::Simulated) {
            continue;
        }
        let (Some(machine), Some(target)) = (inventory.machine(&gpu.machine), inventory.gpu(gpu))
        else {
            continue;
        };
        let cut = placement::mig::layout_for(&target.model, profiles)
            .map_err(|e| e.to_string())
            .map(|layout| crate::inventory::demo::cut(machine, gpu.index, &layout))
            .and_then(|machine| inventory.with_machine(machine).map_err(|e| e.to_string()));
        match cut {
            Ok(cut) => inventory = cut,
            Err(e) => tracing::warn!("{gpu} is not cut as committed: {e}"),
        }
    }
    inventory
}
