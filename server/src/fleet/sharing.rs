//! How each GPU is shared (seed 004): setting it is a committed change like a plan change. It names the
//! engines it restarts (those whose spec it changes: the GPU's sharers, which become or stop being MPS
//! clients), and the runtime carries it out in the memory-safe order, each stopped before it starts again.
//!
//! Cutting a GPU into MIG instances, or joining them back, changes the GPUs themselves ([`super::mig`]).

use super::committed::Committed;
use super::engines;
use super::ledger::Ledger;
use super::mig::Written;
use super::Fleet;
use crate::error::ApiError;
use crate::input::SharingCommand;
use crate::runtime::spec::Host;
use crate::runtime::Hosts;
use app::views::SharingChange;
use placement::holder::Holder;
use placement::mig::Layout;
use placement::sharing::{GpuSharing, Sharing, SharingError};
use placement::{GpuRef, MigRole};
use std::collections::BTreeMap;
use std::sync::Arc;

impl Fleet {
    /// Shares a GPU as `command` says, restarting the engines that changes.
    pub(crate) async fn set_sharing(
        self: &Arc<Self>,
        command: SharingCommand,
        actor: &str,
    ) -> Result<SharingChange, ApiError> {
        let (gpu, sharing, instances) = command.into_parts();
        let actor = actor.to_owned();
        // In a task of its own, so that a client that goes away cannot leave a GPU marked as being cut.
        let fleet = self.clone();
        tokio::spawn(async move {
            let written =
                fleet
                    .write(|fleet| async move {
                        fleet.write_sharing(gpu, sharing, instances, &actor).await
                    })
                    .await?;
            match written {
                Written::Done(change) => Ok(change),
                Written::Local(change) => fleet.carry_out(change).await,
            }
        })
        .await
        .map_err(ApiError::internal)?
    }

    async fn write_sharing(
        &self,
        gpu: GpuRef,
        sharing: GpuSharing,
        instances: Vec<String>,
        actor: &str,
    ) -> Result<Written, ApiError> {
        let mut state = self.state.lock().await;
        let Some(target) = state.ledger.inventory().gpu(&gpu).cloned() else {
            return Err(ApiError::NotFound(format!(
                "there is no {gpu}; GET /api/machines lists the GPUs"
            )));
        };
        let host = self.hosts().host(&gpu.machine);
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
        let layout = match sharing.mode {
            Sharing::Mig => Some(
                placement::mig::layout_for(&target.model, &instances)
                    .map_err(|e| ApiError::Unprocessable(format!("{gpu}: {e}")))?,
            ),
            _ => None,
        };
        let profiles = layout.as_ref().map(Layout::profiles);
        let before = state.committed.sharing(&gpu);
        let cut = target.mig == Some(MigRole::Cut);
        // Unchanged only where the GPU is as stored: one stored as cut that reads whole is cut again.
        if before == sharing
            && state.committed.mig.get(&gpu) == profiles.as_ref()
            && cut == (sharing.mode == Sharing::Mig)
        {
            return Ok(Written::Done(SharingChange {
                gpu: gpu.id(),
                sharing,
                restarts: Vec::new(),
            }));
        }
        // A GPU cut (as stored, or by hand) is joined back before it is shared otherwise.
        if cut || before.mode == Sharing::Mig || sharing.mode == Sharing::Mig {
            return self
                .change_mig(&mut state, gpu, host, sharing, layout, actor)
                .await;
        }
        // Only what this GPU's setting breaks, judged by what it holds now: a GPU of another vendor is the
        // request's fault, too many engines (or one on several GPUs) is what runs there.
        match state.ledger.sharing_refusal(&gpu, sharing.mode) {
            Some(refusal @ SharingError::NotNvidia { .. }) => {
                return Err(ApiError::Unprocessable(refusal.to_string()))
            }
            Some(
                refusal @ (SharingError::TooManyClients { .. } | SharingError::SeveralGpus { .. }),
            ) => return Err(ApiError::Conflict(refusal.to_string())),
            _ => {}
        }
        // What it restarts: the engines on it whose spec the setting changes.
        let mut next = (*state.committed).clone();
        next.apply_sharing(
            &gpu,
            (sharing.mode != Sharing::TimeSlicing).then_some((sharing, None)),
        );
        let hosts = self.hosts();
        let was = engines_on(&state.committed, &state.ledger, &hosts, &gpu);
        // By name, each once (a group's member runs on each of its machines), as the console lists sharers.
        let restarts: Vec<String> = engines_on(&next, &state.ledger, &hosts, &gpu)
            .into_iter()
            .filter(|(unit, print)| was.get(unit).is_some_and(|f| f != print))
            .map(|(unit, _)| Holder::parse(&unit).name().to_owned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut tx = crate::db::write(&self.pool).await?;
        super::committed::store_sharing(&mut tx, &gpu, sharing, None).await?;
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(actor, "gpu.sharing", &gpu.id())
                .before(serde_json::json!(before))
                .after(serde_json::json!(sharing))
                .restarts(restarts.clone()),
        )
        .await?;
        self.finish(&mut state, tx, None, None).await?;
        Ok(Written::Done(SharingChange {
            gpu: gpu.id(),
            sharing,
            restarts,
        }))
    }
}

#[cfg(test)]
mod tests;

/// The engines `committed` runs on `gpu` (its workers', and every engine of the groups holding room on
/// it), with what each is started as.
fn engines_on(
    committed: &Committed,
    ledger: &Ledger,
    hosts: &Hosts,
    gpu: &GpuRef,
) -> BTreeMap<String, String> {
    let holders = ledger.holders_of(gpu);
    let mut workers = Vec::new();
    let mut groups = std::collections::BTreeSet::new();
    for holder in &holders {
        match Holder::parse(holder) {
            Holder::Worker(name) => workers.push(name.to_owned()),
            Holder::Member { group, .. } => {
                groups.insert(group);
            }
        }
    }
    let mut specs = engines::worker_engines(committed, ledger, hosts, &workers);
    for group in groups {
        specs.extend(engines::group_engines(committed, ledger, hosts, group));
    }
    specs
        .into_iter()
        .map(|spec| (spec.unit.clone(), spec.fingerprint()))
        .collect()
}
