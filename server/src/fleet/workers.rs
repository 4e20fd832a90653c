//! Seed 000's workers: accepted (placed at once, or pending with a reason per GPU), ended, and placed when
//! room appears, oldest first.

use super::committed::{Committed, Worker};
use super::ledger::Ledger;
use super::{Fleet, State};
use crate::error::ApiError;
use crate::input::NewWorker;
use app::auth::Caller;
use placement::{Assignment, Decision, RequestedResources, WorkerRequest};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A worker as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerView {
    /// Its name.
    pub name: String,
    /// `placed` or `pending`.
    pub state: String,
    /// Where it runs, when placed.
    pub machine: Option<String>,
    /// The GPU indices it holds on that machine.
    pub gpus: Vec<u32>,
    /// When shared, the GB it takes on each of those GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_shared_gb: Option<f64>,
    /// When pending, why: one sentence per GPU or machine.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub pending_reasons: Vec<String>,
    /// When placed but holding nothing now (its GPU left the inventory), why; its engine does not run.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub not_held: Option<String>,
    /// What it asked for.
    pub requested_resources: RequestedResources,
    /// Its command, if any.
    pub command: Option<String>,
    /// Its environment.
    pub env: BTreeMap<String, String>,
    /// The revision to name when changing or deleting it.
    pub revision: i64,
    /// The catalog model it runs, for a model deployed on whole GPUs.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub model: Option<String>,
}

/// A catalog model that a worker runs on whole GPUs, with the deployment's own extra arguments.
#[derive(Debug, Clone)]
pub(crate) struct ModelRun {
    /// The catalog model.
    pub model: String,
    /// Added to the model's arguments.
    pub args: Vec<String>,
}

/// `worker` with the secrets of its environment redacted (those its model's recipe marks too).
pub(crate) fn redact_worker(committed: &Committed, mut worker: WorkerView) -> WorkerView {
    let marked = worker
        .model
        .as_deref()
        .and_then(|m| committed.model(m))
        .map(|m| m.secret_env.as_slice())
        .unwrap_or_default();
    worker.env = super::authority::redact_env(&worker.env, marked);
    worker
}

impl Fleet {
    /// Accepts a worker: placed at once if it fits, otherwise pending with its reasons.
    pub async fn create_worker(
        self: &Arc<Self>,
        new: NewWorker,
        actor: &Caller,
    ) -> Result<WorkerView, ApiError> {
        super::authority::check_command(actor, new.command())?;
        super::authority::check_worker_env(actor, new.env())?;
        let actor = actor.name.clone();
        self.write(|fleet| async move { fleet.accept_worker(new, None, &actor).await })
            .await
    }

    /// Accepts a worker, under the write lock. One that runs a catalog model (`run`: a deployment on whole
    /// GPUs) is placed at once or refused with its reasons, never left pending.
    pub(crate) async fn accept_worker(
        &self,
        new: NewWorker,
        run: Option<ModelRun>,
        actor: &str,
    ) -> Result<WorkerView, ApiError> {
        let mut state = self.state.lock().await;
        if let Some(run) = &run {
            state.committed.undeployed_model(&run.model)?;
        }
        if state.committed.worker(new.name()).is_some() {
            return Err(ApiError::Conflict(match run {
                Some(_) => format!(
                    "a worker named {} exists; remove it before deploying the model on whole GPUs",
                    new.name()
                ),
                None => format!(
                    "a worker named {} exists; choose another name, or delete it first",
                    new.name()
                ),
            }));
        }
        let (assignment, reasons) = match state.ledger.scheduler().decide(new.request()) {
            Decision::Place(a) => (Some(a), Vec::new()),
            Decision::Wait(r) if run.is_some() => {
                let reasons: Vec<String> = r.iter().map(ToString::to_string).collect();
                return Err(ApiError::Unprocessable(format!(
                    "{} does not fit there: {}",
                    new.name(),
                    reasons.join("; ")
                )));
            }
            Decision::Wait(r) => (None, r.iter().map(ToString::to_string).collect::<Vec<_>>()),
        };
        let placed = if assignment.is_some() {
            "placed"
        } else {
            "pending"
        };
        let mut tx = crate::db::write(&self.pool).await?;
        sqlx::query("INSERT INTO workers (name, request, command, env, state, assignment, pending_reasons, model, args) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
            .bind(new.name())
            .bind(json(new.requested_resources())?)
            .bind(new.command())
            .bind(json(new.env())?)
            .bind(placed)
            .bind(assignment.as_ref().map(json).transpose()?)
            .bind(json(&reasons)?)
            .bind(run.as_ref().map(|r| r.model.as_str()))
            .bind(json(&run.as_ref().map(|r| r.args.clone()).unwrap_or_default())?)
            .execute(&mut *tx)
            .await
            .map_err(|e| ApiError::on_unique(e, || format!("a worker named {} exists; choose another name, or delete it first", new.name())))?;
        let (action, target) = match &run {
            Some(run) => ("deploy", run.model.as_str()),
            None => ("worker.create", new.name()),
        };
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(actor, action, target)
                .after(serde_json::json!({
                    "requested_resources": new.requested_resources(),
                    "state": placed,
                    "assignment": assignment,
                    "pending_reasons": reasons,
                }))
                .revision(1)
                .restarts(run.iter().map(|r| r.model.clone()).collect()),
        )
        .await?;
        self.finish(&mut state, tx, None, None).await?;
        state
            .committed
            .worker(new.name())
            .map(|w| self.with_unreachable(view(w, &state.ledger)))
            .ok_or_else(|| no_worker(new.name()))
    }

    /// One worker.
    pub fn worker(&self, name: &str) -> Result<WorkerView, ApiError> {
        let views = self.views();
        views
            .committed
            .workers
            .seq_of(name)
            .and_then(|seq| views.workers.get(&seq))
            .map(|w| self.with_unreachable(WorkerView::clone(w)))
            .ok_or_else(|| no_worker(name))
    }

    /// Every worker, oldest first.
    pub fn workers(&self) -> Vec<WorkerView> {
        let workers: Vec<WorkerView> = self
            .views()
            .workers
            .values()
            .map(|w| WorkerView::clone(w))
            .collect();
        if self.nothing_unreachable() {
            return workers;
        }
        workers
            .into_iter()
            .map(|w| self.with_unreachable(w))
            .collect()
    }

    /// The workers that wait for room, oldest first: read from the pending index, not from every worker.
    pub fn pending_workers(&self) -> Vec<WorkerView> {
        let views = self.views();
        views
            .committed
            .workers
            .pending()
            .filter_map(|w| views.workers.get(&w.seq))
            .map(|w| self.with_unreachable(WorkerView::clone(w)))
            .collect()
    }

    /// `worker`, whose GPUs asked for or held may be on a machine unreachable now, saying so where that is
    /// why it waits or is not held.
    fn with_unreachable(&self, mut worker: WorkerView) -> WorkerView {
        if self.nothing_unreachable() {
            return worker;
        }
        let asked = worker.requested_resources.gpu_requests.iter();
        let mut machines: Vec<String> = asked
            .flat_map(|r| r.ids.iter())
            .filter_map(|id| id.split_once(':').map(|(m, _)| m.to_owned()))
            .collect();
        machines.extend(worker.machine.clone());
        let machines: Vec<&str> = machines.iter().map(String::as_str).collect();
        worker.pending_reasons = std::mem::take(&mut worker.pending_reasons)
            .into_iter()
            .map(|why| self.said_of_unreachable(why, &machines))
            .collect();
        worker.not_held = worker
            .not_held
            .take()
            .map(|why| self.said_of_unreachable(why, &machines));
        worker
    }

    /// `worker` as one who sees it with `sight` is shown it.
    pub fn shown(&self, worker: WorkerView, sight: super::authority::Sight) -> WorkerView {
        match sight {
            super::authority::Sight::Secrets => worker,
            super::authority::Sight::Redacted => redact_worker(&self.committed(), worker),
        }
    }

    /// Ends a worker: its memory is free for the next, and pending work that now fits is placed, oldest
    /// first. With `revision`, refuses (409) when the worker changed since that revision.
    pub async fn delete_worker(
        self: &Arc<Self>,
        name: &str,
        revision: Option<i64>,
        actor: &str,
    ) -> Result<(), ApiError> {
        let (name, actor) = (name.to_owned(), actor.to_owned());
        self.write(|fleet| async move {
            let mut state = fleet.state.lock().await;
            fleet.end_worker(&mut state, &name, revision, &actor).await
        })
        .await
    }

    /// [`Fleet::delete_worker`] under the write lock.
    pub(super) async fn end_worker(
        &self,
        state: &mut State,
        name: &str,
        revision: Option<i64>,
        actor: &str,
    ) -> Result<(), ApiError> {
        let worker = state
            .committed
            .worker(name)
            .cloned()
            .ok_or_else(|| no_worker(name))?;
        if let Some(sent) = revision.filter(|r| *r != worker.revision) {
            return Err(ApiError::Conflict(format!(
                "worker {name} is at revision {}, not {sent}; read it again and retry",
                worker.revision
            )));
        }
        let mut tx = crate::db::write(&self.pool).await?;
        sqlx::query("DELETE FROM workers WHERE name = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let (action, target) = match &worker.model {
            Some(model) => ("deployment.remove", model.clone()),
            None => ("worker.delete", name.to_owned()),
        };
        let before = view(&worker, &state.ledger);
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(actor, action, &target)
                .before(super::authority::redact_json(
                    serde_json::to_value(before).map_err(ApiError::internal)?,
                    &[],
                ))
                .revision(worker.revision),
        )
        .await?;
        self.finish(state, tx, None, None).await
    }
}

/// What a write settled by its rows changed, for asking the waiting workers again: the machines whose
/// holds, offers or sharing it changed, and the workers it changed (a worker stopped by the over-commit
/// policy waits from now on, and is asked afresh).
pub(super) struct Since<'a> {
    pub(super) machines: &'a BTreeSet<String>,
    pub(super) workers: &'a BTreeSet<String>,
}

/// Places every pending worker that fits now, oldest first, and refreshes the reasons of the rest: in the
/// transaction, in `committed` and in the ledger alike. Says which it changed: placed, or with new reasons.
/// After a write settled by its rows (`since`), a worker that waited before it is asked again of the
/// machines the write changed alone ([`placement::Scheduler::decide_again`]).
pub(super) async fn place_pending(
    ledger: &mut Ledger,
    committed: &mut Committed,
    tx: &mut sqlx::SqliteConnection,
    since: Option<Since<'_>>,
) -> Result<Vec<String>, ApiError> {
    let mut changed = Vec::new();
    let pending: Vec<Arc<Worker>> = committed.workers.pending().cloned().collect();
    for worker in pending {
        let request = WorkerRequest::from_wire(&worker.request)
            .map_err(|e| ApiError::internal(format!("stored request of {}: {e}", worker.name)))?;
        let decision = match &since {
            Some(since) if !since.workers.contains(&worker.name) => {
                ledger.scheduler().decide_again(&request, since.machines)
            }
            _ => ledger.scheduler().decide(&request),
        };
        match decision {
            Decision::Place(assignment) => {
                sqlx::query("UPDATE workers SET state = 'placed', assignment = ?, pending_reasons = '[]', revision = revision + 1 WHERE name = ?")
                    .bind(json(&assignment)?)
                    .bind(&worker.name)
                    .execute(&mut *tx)
                    .await?;
                ledger
                    .hold(&worker.name, assignment.clone())
                    .map_err(ApiError::internal)?;
                changed.push(worker.name.clone());
                committed.workers.change(&worker.name, |w| {
                    w.assignment = Some(assignment);
                    w.pending_reasons.clear();
                    w.revision += 1;
                });
            }
            Decision::Wait(reasons) => {
                let reasons: Vec<String> = reasons.iter().map(ToString::to_string).collect();
                // Most writes leave most pending workers' reasons as they were: write only a change.
                if reasons != worker.pending_reasons {
                    sqlx::query("UPDATE workers SET pending_reasons = ? WHERE name = ?")
                        .bind(json(&reasons)?)
                        .bind(&worker.name)
                        .execute(&mut *tx)
                        .await?;
                    changed.push(worker.name.clone());
                    committed
                        .workers
                        .change(&worker.name, |w| w.pending_reasons = reasons);
                }
            }
        }
    }
    Ok(changed)
}

/// Makes a placed worker wait again (the over-commit policy stopped it), in the transaction and in
/// `committed`; [`place_pending`] then gives it its reasons.
pub(super) async fn unplace(
    tx: &mut sqlx::SqliteConnection,
    committed: &mut Committed,
    name: &str,
    why: &str,
) -> Result<(), ApiError> {
    let reasons = vec![why.to_owned()];
    sqlx::query("UPDATE workers SET state = 'pending', assignment = NULL, pending_reasons = ?, revision = revision + 1 WHERE name = ?")
        .bind(json(&reasons)?)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    committed.workers.change(name, |worker| {
        worker.assignment = None;
        worker.pending_reasons = reasons;
        worker.revision += 1;
    });
    Ok(())
}

pub(super) fn no_worker(name: &str) -> ApiError {
    ApiError::NotFound(format!("there is no worker named {name}"))
}

/// A worker as the API shows it, with what the ledger says of it.
pub(super) fn view(worker: &Worker, ledger: &Ledger) -> WorkerView {
    let assignment: Option<&Assignment> = worker.assignment.as_ref();
    WorkerView {
        name: worker.name.clone(),
        state: if assignment.is_some() {
            "placed"
        } else {
            "pending"
        }
        .to_owned(),
        machine: assignment.map(|a| a.machine.clone()),
        gpus: assignment.map(|a| a.gpus.clone()).unwrap_or_default(),
        gpu_shared_gb: assignment
            .and_then(|a| a.shared)
            .map(placement::Bytes::as_gb_f64),
        pending_reasons: worker.pending_reasons.clone(),
        not_held: ledger.unplaced(&worker.name).map(str::to_owned),
        requested_resources: worker.request.clone(),
        command: worker.command.clone(),
        env: worker.env.clone(),
        revision: worker.revision,
        model: worker.model.clone(),
    }
}

/// JSON for a column.
pub(super) fn json(value: &impl Serialize) -> Result<String, ApiError> {
    serde_json::to_string(value).map_err(ApiError::internal)
}
