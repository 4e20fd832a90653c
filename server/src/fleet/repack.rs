//! Repacking the fleet (seed 001): the plan from what is committed, and carrying it out one move at a time,
//! each a committed change that the runtime carries out (the engines it moves stop, drained, before they
//! start on their new GPU) and settles before the next; stoppable between moves.
//!
//! What may move: each shared worker on one GPU, and each sharing group on one GPU (all its members
//! together, only to a GPU of the same size, as their shares are of one GPU's memory). Work on whole GPUs,
//! on several GPUs, or on a machine whose containers see every GPU stays where it is.

use super::committed::Committed;
use super::ledger::Ledger;
use super::workers::json;
use super::Fleet;
use crate::error::ApiError;
use app::views::{RepackProgress, RepackRun};
use placement::holder::Holder;
use placement::repack::Goal;
use placement::{
    Assignment, GpuDemand, GpuMode, GpuRef, Hold, Movable, Move, Policy, RepackError, RepackInput,
    RepackPlan, RepackStep, WorkerRequest,
};
use std::sync::{Arc, PoisonError};

/// A repack being carried out (or the last one), and whether an operator asked it to stop before its next
/// move.
#[derive(Debug, Clone)]
pub(crate) struct Repacking {
    run: RepackRun,
    stop: bool,
}

/// The units that may move, as committed.
fn movable(committed: &Committed, ledger: &Ledger) -> Vec<Movable> {
    let scheduler = ledger.scheduler();
    let mut units = Vec::new();
    for worker in &committed.workers {
        let Some(assignment) = &worker.assignment else {
            continue;
        };
        if assignment.shared.is_none() || assignment.gpus.len() != 1 || worker.model.is_some() {
            continue;
        }
        // Kept aside (its GPU left the inventory, or a reading left it no room there): it holds nothing
        // to move, and waits for its own GPU.
        if !scheduler.workers().contains_key(&worker.name) {
            continue;
        }
        let Ok(request) = WorkerRequest::from_wire(&worker.request) else {
            continue;
        };
        if let Some(demand) = request.gpus {
            units.push(Movable {
                name: worker.name.clone(),
                workers: vec![worker.name.clone()],
                demand,
                same_size: false,
            });
        }
    }
    for group in &committed.groups {
        let [gpu] = group.gpus.as_slice() else {
            continue;
        };
        let Some(Hold::Shared(sharers)) = scheduler.hold(gpu) else {
            continue;
        };
        let prefix = placement::holder::group_prefix(&group.name);
        let holders: Vec<String> = sharers
            .keys()
            .filter(|h| h.starts_with(&prefix))
            .cloned()
            .collect();
        if holders.is_empty() {
            continue;
        }
        units.push(Movable {
            name: group.name.clone(),
            workers: holders,
            demand: GpuDemand {
                count: 1,
                mode: GpuMode::Shared(placement::Bytes::ZERO),
                vendor: None,
                models: Vec::new(),
                healthy_only: true,
                ids: Vec::new(),
                policy: Policy::Any,
            },
            same_size: true,
        });
    }
    units
}

/// The repack's input from the committed state and its ledger.
fn input(committed: &Committed, ledger: &Ledger) -> RepackInput {
    let scheduler = ledger.scheduler();
    RepackInput {
        inventory: scheduler.inventory().clone(),
        holds: scheduler
            .workers()
            .iter()
            .map(|(h, a)| (h.clone(), a.clone()))
            .collect(),
        movable: movable(committed, ledger),
        sharing: committed
            .sharing
            .iter()
            .map(|(gpu, sharing)| (gpu.clone(), sharing.mode))
            .collect(),
    }
}

/// The steps of `plan` as they are carried out: a unit that stops and starts at once is one step; units
/// that must trade places (one stops before another can start) move together in one step, whose engines
/// all stop before any starts.
fn batches(plan: &RepackPlan) -> Vec<Vec<Move>> {
    let find = |unit: &str| {
        plan.moves
            .iter()
            .find(|m| m.unit == unit)
            .expect("a step is of a move")
            .clone()
    };
    let mut out = Vec::new();
    let mut open: Vec<Move> = Vec::new();
    let mut stopped = 0usize;
    for step in &plan.steps {
        match step {
            RepackStep::Stop { unit, .. } => {
                stopped += 1;
                open.push(find(unit));
            }
            RepackStep::Start { .. } => {
                stopped -= 1;
                if stopped == 0 {
                    out.push(std::mem::take(&mut open));
                }
            }
        }
    }
    out
}

fn refusal(e: RepackError) -> ApiError {
    match e {
        RepackError::Unordered { .. } => ApiError::internal(e),
        other => ApiError::Unprocessable(other.to_string()),
    }
}

impl Fleet {
    /// What the browser plans a repack from: the fleet as committed now.
    pub async fn repack_input(&self) -> RepackInput {
        let state = self.state.lock().await;
        input(&state.committed, &state.ledger)
    }

    /// What the repack page is drawn from: the fleet as committed now, and the plan that frees the most
    /// GPUs from it (worked out here once, where the browser would work it out again as it hydrates).
    pub async fn repack_preview(&self) -> app::views::RepackPreview {
        let input = self.repack_input().await;
        // Hundreds of milliseconds at ten thousand GPUs: off the executor.
        let planned = input.clone();
        let most = tokio::task::spawn_blocking(move || {
            planned.plan(Goal::Most).map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|e| {
            tracing::error!("the repack's plan could not be worked out: {e}");
            Err("the plan could not be worked out; it has been logged".to_owned())
        });
        app::views::RepackPreview { input, most }
    }

    /// The repack plan for `goal` from the fleet as committed now. Changes nothing.
    pub async fn repack_plan(&self, goal: Goal) -> Result<RepackPlan, ApiError> {
        self.repack_input().await.plan(goal).map_err(refusal)
    }

    /// The repack being carried out, or the last one since the server started.
    pub fn repack_run(&self) -> Option<RepackRun> {
        self.repack
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|r| r.run.clone())
    }

    fn repack_stopping(&self) -> bool {
        self.repack
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|r| r.stop)
    }

    /// Plans a repack for `goal` again and starts carrying it out. With `expect` (the moves the operator
    /// was shown), refuses (409) when the fleet changed so that the plan is no longer those moves.
    pub async fn start_repack(
        self: &Arc<Self>,
        goal: Goal,
        expect: Option<Vec<Move>>,
        actor: &str,
    ) -> Result<RepackRun, ApiError> {
        let plan = self.repack_plan(goal).await?;
        if expect.as_ref().is_some_and(|e| *e != plan.moves) {
            return Err(ApiError::Conflict(
                "the fleet changed since this repack was planned; look at the new plan and start it again"
                    .to_owned(),
            ));
        }
        if plan.moves.is_empty() {
            return Err(ApiError::Unprocessable(
                "this repack moves nothing and frees no GPU".to_owned(),
            ));
        }
        let run = RepackRun {
            state: "running".to_owned(),
            started_by: actor.to_owned(),
            steps: batches(&plan)
                .into_iter()
                .map(|moves| RepackProgress {
                    moves,
                    status: "waiting".to_owned(),
                    message: None,
                })
                .collect(),
            plan,
        };
        {
            let mut current = self.repack.lock().unwrap_or_else(PoisonError::into_inner);
            if current.as_ref().is_some_and(|r| r.run.state == "running") {
                return Err(ApiError::Conflict(
                    "a repack is being carried out; wait for it, or stop it first".to_owned(),
                ));
            }
            *current = Some(Repacking {
                run: run.clone(),
                stop: false,
            });
        }
        let mut tx = crate::db::write(&self.pool).await?;
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(actor, "repack.start", "fleet")
                .after(serde_json::json!({
                    "moves": run.plan.moves,
                    "freed": run.plan.freed,
                }))
                .restarts(
                    run.plan
                        .moves
                        .iter()
                        .flat_map(|m| m.workers.clone())
                        .collect(),
                ),
        )
        .await?;
        tx.commit().await?;
        let fleet = self.clone();
        let actor = actor.to_owned();
        tokio::spawn(async move { fleet.carry_out_repack(&actor).await });
        Ok(run)
    }

    /// Asks the repack being carried out to stop before its next move. What moved stays moved: each move
    /// left the fleet in a state the rules allow.
    pub async fn stop_repack(&self, actor: &str) -> Result<RepackRun, ApiError> {
        let run = {
            let mut current = self.repack.lock().unwrap_or_else(PoisonError::into_inner);
            match current.as_mut() {
                Some(r) if r.run.state == "running" => {
                    r.stop = true;
                    r.run.clone()
                }
                _ => {
                    return Err(ApiError::Conflict(
                        "no repack is being carried out".to_owned(),
                    ))
                }
            }
        };
        let mut tx = crate::db::write(&self.pool).await?;
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(actor, "repack.stop", "fleet"),
        )
        .await?;
        tx.commit().await?;
        Ok(run)
    }

    fn repack_step(&self, i: usize, status: &str, message: Option<String>) {
        if let Some(Repacking { run, .. }) = self
            .repack
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            run.steps[i].status = status.to_owned();
            run.steps[i].message = message;
        }
    }

    fn repack_end(&self, state: &str, from: usize) {
        if let Some(Repacking { run, .. }) = self
            .repack
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            run.state = state.to_owned();
            for step in &mut run.steps[from..] {
                if step.status == "waiting" {
                    step.status = "stopped".to_owned();
                }
            }
        }
    }

    async fn carry_out_repack(self: Arc<Self>, actor: &str) {
        let steps: Vec<Vec<Move>> = match self.repack_run() {
            Some(run) => run.steps.into_iter().map(|s| s.moves).collect(),
            None => return,
        };
        for (i, moves) in steps.iter().enumerate() {
            if self.repack_stopping() {
                self.repack_end("stopped", i);
                return;
            }
            self.repack_step(i, "running", None);
            let moved = {
                let moves = moves.clone();
                let actor = actor.to_owned();
                self.write(|fleet| async move { fleet.make_moves(&moves, &actor).await })
                    .await
            };
            match moved {
                Ok(()) => {
                    // The step's own GPUs, not the fleet's: an unrelated engine loading for minutes
                    // elsewhere does not hold the repack up.
                    let gpus: Vec<GpuRef> = moves
                        .iter()
                        .flat_map(|m| [m.from.clone(), m.to.clone()])
                        .collect();
                    self.runtime.settled_on(&gpus).await;
                    self.repack_step(i, "done", None);
                }
                Err(e) => {
                    tracing::warn!("a repack stops: {e}");
                    self.repack_step(i, "failed", Some(e.to_string()));
                    self.repack_end("failed", i + 1);
                    return;
                }
            }
        }
        self.repack_end("done", steps.len());
    }

    /// Commits `moves` as one change, each checked against the fleet as it is now: the unit still where the
    /// plan found it, and room for it where it goes.
    async fn make_moves(&self, moves: &[Move], actor: &str) -> Result<(), ApiError> {
        let mut state = self.state.lock().await;
        let mut check = state.ledger.scheduler().clone();
        let mut held: Vec<(String, Assignment)> = Vec::new();
        for mv in moves {
            let here = match check.hold(&mv.from) {
                Some(Hold::Shared(sharers)) => mv.workers.iter().all(|w| sharers.contains_key(w)),
                _ => false,
            };
            if !here {
                return Err(ApiError::Conflict(format!(
                    "{} is no longer on {}: the fleet changed since the repack was planned",
                    mv.unit, mv.from
                )));
            }
            for worker in &mv.workers {
                let assignment = check.release(worker).expect("held a moment ago");
                held.push((worker.clone(), assignment));
            }
        }
        for mv in moves {
            for worker in &mv.workers {
                let (_, was) = held.iter().find(|(w, _)| w == worker).expect("released");
                check.hold_for(worker, was.moved_to(&mv.to)).map_err(|e| {
                    ApiError::Conflict(format!("{} no longer fits on {}: {e}", mv.unit, mv.to))
                })?;
            }
        }
        let mut tx = crate::db::write(&self.pool).await?;
        for mv in moves {
            match state.committed.group(&mv.unit).filter(|_| {
                mv.workers
                    .first()
                    .is_some_and(|w| Holder::parse(w).group().is_some())
            }) {
                Some(group) => {
                    sqlx::query(
                        "UPDATE groups SET gpus = ?, revision = revision + 1 WHERE name = ?",
                    )
                    .bind(json(&vec![mv.to.clone()])?)
                    .bind(&group.name)
                    .execute(&mut *tx)
                    .await?;
                }
                None => {
                    // What the check above holds for it now: its assignment on the GPU it moves to.
                    let moved = check
                        .workers()
                        .get(&mv.unit)
                        .ok_or_else(|| ApiError::internal(format!("{}: no worker", mv.unit)))?;
                    sqlx::query(
                        "UPDATE workers SET assignment = ?, revision = revision + 1 WHERE name = ?",
                    )
                    .bind(json(moved)?)
                    .bind(&mv.unit)
                    .execute(&mut *tx)
                    .await?;
                }
            }
            crate::audit::record(
                &mut tx,
                crate::audit::Entry::new(actor, "repack.move", &mv.unit)
                    .before(serde_json::json!({ "gpu": mv.from.id() }))
                    .after(serde_json::json!({ "gpu": mv.to.id() }))
                    .restarts(group_models(&mv.workers)),
            )
            .await?;
        }
        self.finish(&mut state, tx, None, None).await
    }
}

/// The names that restart when these holders move: a worker's own name, a group member's model (the room
/// on-demand members take turns in is no engine).
fn group_models(holders: &[String]) -> Vec<String> {
    holders
        .iter()
        .map(|h| Holder::parse(h))
        .filter(|h| !h.is_turns())
        .map(|h| h.name().to_owned())
        .collect()
}

#[cfg(test)]
mod tests;
