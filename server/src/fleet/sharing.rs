//! How each GPU is shared (seed 004): setting it is a committed change like a plan change. It names the
//! engines it restarts (those whose spec it changes: the GPU's sharers, which become or stop being MPS
//! clients), and the runtime carries it out in the memory-safe order, each stopped before it starts again.

use super::engines;
use super::ledger::Ledger;
use super::Fleet;
use crate::error::ApiError;
use crate::runtime::spec::Host;
use app::views::SharingChange;
use placement::sharing::{GpuSharing, Sharing, SharingError};
use placement::GpuRef;
use std::collections::BTreeMap;
use std::sync::Arc;

impl Fleet {
    /// Shares `gpu` as `sharing` says, restarting the engines that changes.
    pub(crate) async fn set_sharing(
        self: &Arc<Self>,
        gpu: GpuRef,
        sharing: GpuSharing,
        actor: &str,
    ) -> Result<SharingChange, ApiError> {
        let actor = actor.to_owned();
        self.write(|fleet| async move { fleet.write_sharing(gpu, sharing, &actor).await })
            .await
    }

    async fn write_sharing(
        &self,
        gpu: GpuRef,
        sharing: GpuSharing,
        actor: &str,
    ) -> Result<SharingChange, ApiError> {
        let mut state = self.state.lock().await;
        if state.ledger.inventory().gpu(&gpu).is_none() {
            return Err(ApiError::NotFound(format!(
                "there is no {gpu}; GET /api/machines lists the GPUs"
            )));
        }
        let refusal = match (sharing.mode, self.hosts.host(&gpu.machine)) {
            (Sharing::Mig, _) => Some(SharingError::MigNotApplied {
                gpu: gpu.to_string(),
            }),
            (Sharing::Mps, Host::Remote) => Some(SharingError::NoDaemonThere {
                gpu: gpu.to_string(),
                machine: gpu.machine.clone(),
            }),
            _ => None,
        };
        if let Some(refusal) = refusal {
            return Err(ApiError::Unprocessable(refusal.to_string()));
        }
        let before = state.committed.sharing(&gpu);
        let change = |restarts| SharingChange {
            gpu: gpu.id(),
            sharing,
            restarts,
        };
        if before == sharing {
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
        let index = i64::from(gpu.index);
        if sharing.mode == Sharing::TimeSlicing {
            sqlx::query("DELETE FROM gpu_sharing WHERE machine = ? AND gpu_index = ?")
                .bind(&gpu.machine)
                .bind(index)
                .execute(&mut *tx)
                .await?;
        } else {
            sqlx::query(
                "INSERT OR REPLACE INTO gpu_sharing (machine, gpu_index, mode, compute_percent) VALUES (?, ?, ?, ?)",
            )
            .bind(&gpu.machine)
            .bind(index)
            .bind(sharing.mode.as_str())
            .bind(sharing.compute_percent.map(i64::from))
            .execute(&mut *tx)
            .await?;
        }
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

#[cfg(test)]
mod tests;
