//! How each GPU is shared (seed 004): setting it is a committed change like a plan change. It names the
//! engines it restarts (those whose spec it changes: the GPU's sharers, which become or stop being MPS
//! clients), and the runtime carries it out in the memory-safe order, each stopped before it starts again.
//!
//! Cutting a GPU into MIG instances, or joining them back, changes the GPUs themselves: it is done only
//! while nothing runs on the GPU or its instances, through `nvidia-smi` on this machine (the demo fleet's
//! made-up GPUs are cut in the inventory alone), and the instances then stand in the inventory as GPUs of
//! their own, each held whole.

use super::engines;
use super::ledger::Ledger;
use super::Fleet;
use crate::error::ApiError;
use crate::runtime::spec::Host;
use app::views::SharingChange;
use placement::mig::Layout;
use placement::sharing::{GpuSharing, Sharing, SharingError};
use placement::{GpuRef, Hold, Inventory, MigRole};
use std::collections::BTreeMap;
use std::sync::Arc;

impl Fleet {
    /// Shares `gpu` as `sharing` says, restarting the engines that changes.
    pub(crate) async fn set_sharing(
        self: &Arc<Self>,
        gpu: GpuRef,
        sharing: GpuSharing,
        instances: Option<Vec<String>>,
        actor: &str,
    ) -> Result<SharingChange, ApiError> {
        let instances = match instances {
            Some(_) if sharing.mode != Sharing::Mig => {
                return Err(ApiError::Unprocessable(
                    SharingError::InstancesWithoutMig.to_string(),
                ))
            }
            instances => instances.unwrap_or_default(),
        };
        let actor = actor.to_owned();
        self.write(
            |fleet| async move { fleet.write_sharing(gpu, sharing, instances, &actor).await },
        )
        .await
    }

    async fn write_sharing(
        &self,
        gpu: GpuRef,
        sharing: GpuSharing,
        instances: Vec<String>,
        actor: &str,
    ) -> Result<SharingChange, ApiError> {
        let mut state = self.state.lock().await;
        let Some(target) = state.ledger.inventory().gpu(&gpu).cloned() else {
            return Err(ApiError::NotFound(format!(
                "there is no {gpu}; GET /api/machines lists the GPUs"
            )));
        };
        let host = self.hosts.host(&gpu.machine);
        let refusal = match (sharing.mode, &host, &target.mig) {
            (_, _, Some(MigRole::Instance { .. })) => Some(SharingError::InstanceHeldWhole {
                gpu: gpu.to_string(),
            }),
            (Sharing::Mig, Host::Remote | Host::Cluster { .. }, _) => {
                Some(SharingError::NoMigThere {
                    gpu: gpu.to_string(),
                    machine: gpu.machine.clone(),
                })
            }
            (Sharing::Mps, Host::Remote, _) => Some(SharingError::NoDaemonThere {
                gpu: gpu.to_string(),
                machine: gpu.machine.clone(),
            }),
            _ => None,
        };
        if let Some(refusal) = refusal {
            return Err(ApiError::Unprocessable(refusal.to_string()));
        }
        let layout = if sharing.mode == Sharing::Mig {
            let laid = placement::mig::menu(&target.model)
                .ok_or_else(|| placement::mig::NoLayout::NoMenu {
                    model: target.model.clone(),
                })
                .and_then(|menu| placement::mig::layout_of(menu, &instances))
                .map_err(|e| ApiError::Unprocessable(format!("{gpu}: {e}")))?;
            Some(laid)
        } else {
            None
        };
        let profiles: Option<Vec<String>> = layout.as_ref().map(|l| {
            l.instances
                .iter()
                .map(|p| p.profile.name.to_owned())
                .collect()
        });
        let before = state.committed.sharing(&gpu);
        let cut_before = state.committed.mig.get(&gpu).cloned();
        let change = |restarts| SharingChange {
            gpu: gpu.id(),
            sharing,
            restarts,
        };
        if before == sharing && cut_before == profiles {
            return Ok(change(Vec::new()));
        }
        if before.mode == Sharing::Mig || sharing.mode == Sharing::Mig {
            let inventory = self.recut(&state, &gpu, &host, layout.as_ref()).await?;
            let mut tx = crate::db::write(&self.pool).await?;
            store(&mut tx, &gpu, sharing, profiles.as_deref()).await?;
            crate::audit::record(
                &mut tx,
                crate::audit::Entry::new(actor, "gpu.sharing", &gpu.id())
                    .before(serde_json::json!({ "sharing": before, "instances": cut_before }))
                    .after(serde_json::json!({ "sharing": sharing, "instances": profiles })),
            )
            .await?;
            self.finish(&mut state, tx, inventory, None).await?;
            return Ok(change(Vec::new()));
        }
        // What it restarts: the engines whose spec the setting changes, worked out on the state it leads to,
        // which must hold what the GPU runs (an MPS GPU takes so many engines, each on it alone).
        let mut next = (*state.committed).clone();
        if sharing.mode == Sharing::TimeSlicing {
            next.sharing.remove(&gpu);
        } else {
            next.sharing.insert(gpu.clone(), sharing);
        }
        let ledger = Ledger::build(state.ledger.inventory().clone(), &next);
        // Only what this GPU's setting breaks: a GPU of another vendor is the request's fault, too many
        // engines (or one on several GPUs) is what runs there.
        let here = gpu.to_string();
        let refusal = ledger
            .sharing_refusals(&next)
            .into_iter()
            .find(|r| match r {
                SharingError::TooManyClients { gpu, .. }
                | SharingError::NotNvidia { gpu, .. }
                | SharingError::SeveralGpus { gpu, .. } => *gpu == here,
                _ => false,
            });
        match refusal {
            Some(refusal @ SharingError::NotNvidia { .. }) => {
                return Err(ApiError::Unprocessable(refusal.to_string()))
            }
            Some(refusal) => return Err(ApiError::Conflict(refusal.to_string())),
            None => {}
        }
        let was: BTreeMap<String, String> =
            engines::desired(&state.committed, &state.ledger, &self.hosts)
                .into_iter()
                .map(|spec| (spec.unit.clone(), spec.fingerprint()))
                .collect();
        // By name, each once (a group's member runs on each of its machines), as the console lists sharers.
        let restarts: Vec<String> = engines::desired(&next, &ledger, &self.hosts)
            .iter()
            .filter(|spec| {
                was.get(&spec.unit)
                    .is_some_and(|f| *f != spec.fingerprint())
            })
            .map(|spec| super::groups::sharer(&spec.unit).0.to_owned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut tx = crate::db::write(&self.pool).await?;
        store(&mut tx, &gpu, sharing, None).await?;
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(actor, "gpu.sharing", &gpu.id())
                .before(serde_json::json!(before))
                .after(serde_json::json!(sharing))
                .restarts(restarts.clone()),
        )
        .await?;
        let inventory = state.ledger.inventory().clone();
        self.finish(&mut state, tx, inventory, None).await?;
        Ok(change(restarts))
    }
}

impl Fleet {
    /// Cuts `gpu` into `layout`'s instances, or joins it back whole where there is none, once nothing runs
    /// on it or its instances; answers the inventory that follows.
    async fn recut(
        &self,
        state: &super::State,
        gpu: &GpuRef,
        host: &Host,
        layout: Option<&Layout>,
    ) -> Result<Inventory, ApiError> {
        let inventory = state.ledger.inventory();
        let machine = inventory
            .machine(&gpu.machine)
            .ok_or_else(|| ApiError::NotFound(format!("there is no machine {}", gpu.machine)))?;
        let mut running = std::collections::BTreeSet::new();
        for g in machine.gpus.iter().filter(|g| {
            g.index == gpu.index
                || matches!(&g.mig, Some(MigRole::Instance { parent, .. }) if *parent == gpu.index)
        }) {
            match state
                .ledger
                .scheduler()
                .hold(&GpuRef::new(&gpu.machine, g.index))
            {
                Some(Hold::Whole(by)) => {
                    running.insert(super::groups::sharer(by).0.to_owned());
                }
                Some(Hold::Shared(sharers)) => running.extend(
                    sharers
                        .keys()
                        .map(|unit| super::groups::sharer(unit).0.to_owned()),
                ),
                Some(Hold::Free) | None => {}
            }
        }
        if !running.is_empty() {
            return Err(ApiError::Conflict(
                SharingError::MigBusy {
                    gpu: gpu.to_string(),
                    engines: running.into_iter().collect(),
                }
                .to_string(),
            ));
        }
        match host {
            Host::Simulated => {
                let machine = match layout {
                    Some(layout) => crate::inventory::demo::cut(machine, gpu.index, layout),
                    None => crate::inventory::demo::join(machine, gpu.index),
                };
                inventory.with_machine(machine).map_err(ApiError::internal)
            }
            Host::Local => {
                let nvidia_smi = self.runtime.nvidia_smi();
                let done = match layout {
                    Some(layout) => nvidia_smi.cut(gpu.index, layout).await,
                    None => nvidia_smi.join(gpu.index).await,
                };
                done.map_err(|why| {
                    ApiError::Conflict(format!(
                        "{gpu} could not be {}: {why}",
                        if layout.is_some() {
                            "cut"
                        } else {
                            "joined back"
                        }
                    ))
                })?;
                Ok(self.read_local(state, inventory.clone()).await)
            }
            Host::Remote | Host::Cluster { .. } => Err(ApiError::Unprocessable(
                SharingError::NoMigThere {
                    gpu: gpu.to_string(),
                    machine: gpu.machine.clone(),
                }
                .to_string(),
            )),
        }
    }

    /// `inventory` with this machine as NVML reads it now; as it was where the reading fails (the next
    /// reading brings the change).
    async fn read_local(&self, state: &super::State, inventory: Inventory) -> Inventory {
        let Some(gpus) = self.runtime.local_gpus() else {
            return inventory;
        };
        let local = self.hosts.local.as_deref().unwrap_or_default();
        let ours = engines::ours(&state.ledger, local, &self.runtime.running().await);
        match super::read_local(&gpus, ours, &inventory).await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!("this machine's GPUs could not be read after a MIG change: {e}");
                inventory
            }
        }
    }
}

/// Cuts again each GPU of this machine (`local`) that was cut as committed but whose instances the driver
/// no longer lists: MIG instances do not outlive a reboot or a driver reload, while MIG mode does. Each
/// cut, or why it failed, is logged; answers whether any was made, for the caller to read the machine
/// again.
pub(super) async fn recut(
    inventory: &Inventory,
    committed: &super::Committed,
    local: &str,
    nvidia_smi: &crate::runtime::mig::NvidiaSmi,
) -> bool {
    let Some(machine) = inventory.machine(local) else {
        return false;
    };
    let mut cut = false;
    for (gpu, profiles) in committed.mig.iter().filter(|(g, _)| g.machine == local) {
        let listed = machine.gpus.iter().any(
            |g| matches!(&g.mig, Some(MigRole::Instance { parent, .. }) if *parent == gpu.index),
        );
        let Some(target) = inventory.gpu(gpu).filter(|_| !listed) else {
            continue;
        };
        let layout = placement::mig::menu(&target.model)
            .ok_or_else(|| format!("{} has no MIG menu", target.model))
            .and_then(|menu| placement::mig::layout_of(menu, profiles).map_err(|e| e.to_string()));
        let done = match layout {
            Ok(layout) => nvidia_smi.cut(gpu.index, &layout).await,
            Err(e) => Err(e),
        };
        match done {
            Ok(()) => {
                tracing::info!("{gpu} was cut into MIG instances again ({}): the driver listed none of them", profiles.join(", "));
                cut = true;
            }
            Err(e) => tracing::warn!("{gpu} is committed as cut into MIG instances ({}), which the driver does not list, and could not be cut again: {e}", profiles.join(", ")),
        }
    }
    cut
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
        let layout = placement::mig::menu(&target.model)
            .ok_or_else(|| format!("{} has no MIG menu", target.model))
            .and_then(|menu| placement::mig::layout_of(menu, profiles).map_err(|e| e.to_string()));
        let cut = layout
            .map(|layout| crate::inventory::demo::cut(machine, gpu.index, &layout))
            .and_then(|machine| inventory.with_machine(machine).map_err(|e| e.to_string()));
        match cut {
            Ok(cut) => inventory = cut,
            Err(e) => tracing::warn!("{gpu} is not cut as committed: {e}"),
        }
    }
    inventory
}

/// Writes how `gpu` is shared (time-slicing has no row), with the profiles it was cut into under MIG.
async fn store(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    gpu: &GpuRef,
    sharing: GpuSharing,
    instances: Option<&[String]>,
) -> Result<(), ApiError> {
    let index = i64::from(gpu.index);
    if sharing.mode == Sharing::TimeSlicing {
        sqlx::query("DELETE FROM gpu_sharing WHERE machine = ? AND gpu_index = ?")
            .bind(&gpu.machine)
            .bind(index)
            .execute(&mut **tx)
            .await?;
    } else {
        sqlx::query(
            "INSERT OR REPLACE INTO gpu_sharing (machine, gpu_index, mode, compute_percent, mig_instances) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&gpu.machine)
        .bind(index)
        .bind(sharing.mode.as_str())
        .bind(sharing.compute_percent.map(i64::from))
        .bind(instances.map(|i| serde_json::json!(i).to_string()))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
