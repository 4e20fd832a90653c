//! A deployed catalog model, wherever it runs: as a member of a sharing group, or on whole GPUs (a worker
//! that names its model). Deploying one, removing one, and changing its serving configuration, which
//! restarts it alone.

use super::authority::{
    check_serving as check_model_serving, keep_secrets, redact_args, redact_env, secret_values,
};
use super::committed::{Committed, Worker};
use super::groups::{
    check_revision, no_group, plan_with, router_runs_everywhere, router_stays_pinned, Group, Note,
    PlanChange, Serving,
};
use super::workers::ModelRun;
use super::Fleet;
use crate::audit::Entry;
use crate::error::ApiError;
use crate::input::{DeployCommand, NewWorker, ServingSettings, Sharing};
use app::auth::Caller;
use placement::{
    choose_group, BasisPoints, GpuRef, GpuRequests, GroupChoice, PlanMember, RequestedResources,
    Restart, Step,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Where a deployed model runs.
pub(crate) enum Deployed {
    /// In a sharing group.
    Group(Box<Group>),
    /// On whole GPUs, as this worker.
    Whole(Box<Worker>),
}

/// What a change of serving configuration does.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServingChange {
    /// The model.
    pub model: String,
    /// Its group, if it runs in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The revision after the change (the group's, or the worker's).
    pub revision: i64,
    /// What restarts: the model alone.
    pub restarts: Vec<String>,
}

impl Fleet {
    /// Where `model` runs, if it runs, as of the last write.
    pub(crate) fn deployed(&self, model: &str) -> Option<Deployed> {
        deployed(&self.committed(), model)
    }

    /// A deployed model's own serving configuration: extra arguments and environment variables.
    pub(crate) fn serving_of(
        &self,
        model: &str,
    ) -> Result<(Vec<String>, BTreeMap<String, String>), ApiError> {
        match self
            .deployed(model)
            .ok_or_else(|| super::not_deployed(model))?
        {
            Deployed::Group(group) => {
                let serving = group.serving.get(model).cloned().unwrap_or_default();
                Ok((serving.args, serving.env))
            }
            Deployed::Whole(worker) => Ok((worker.args, worker.env)),
        }
    }

    /// The secret values an engine was given (its recipe's, its deployment's or its worker's), to be kept
    /// out of what non-admins read of its output.
    pub fn engine_secrets(&self, engine: &crate::runtime::EngineView) -> Vec<String> {
        let committed = self.committed();
        let model = engine.model.clone().or_else(|| {
            let worker = committed.worker(engine.worker.as_deref()?)?;
            worker.model.clone()
        });
        let recipe = model.as_deref().and_then(|m| committed.model(m));
        let marked = recipe.map(|r| r.secret_env.clone()).unwrap_or_default();
        let mut secrets = Vec::new();
        if let Some(recipe) = recipe {
            secrets.extend(secret_values(&recipe.env, &recipe.args, &marked));
        }
        let own = match (&engine.worker, &model) {
            (None, Some(model)) => self.serving_of(model).ok(),
            (Some(worker), _) => committed
                .worker(worker)
                .map(|w| (w.args.clone(), w.env.clone())),
            (None, None) => None,
        };
        if let Some((args, env)) = own {
            secrets.extend(secret_values(&env, &args, &marked));
        }
        secrets
    }

    /// Deploys a catalog model onto a share of the chosen GPUs: it joins the group that runs there, or
    /// starts one (named by its recipe, or after the model), into which the router moves. With sharing off
    /// it takes whole GPUs of one machine instead.
    pub async fn deploy(
        self: &Arc<Self>,
        deploy: DeployCommand,
        actor: &Caller,
    ) -> Result<PlanChange, ApiError> {
        // Judged before the write: reading the model's file may take a Ray node's job.
        if let (Sharing::Shared { share, .. }, Some(model)) =
            (&deploy.sharing, self.committed().model(&deploy.model))
        {
            let share = share.unwrap_or(model.default_share);
            self.judge_given_context(
                &deploy.model,
                deploy.serving.args(),
                deploy.gpus.gpus(),
                share,
            )
            .await?;
        }
        let caller = actor.clone();
        let actor = actor.name.clone();
        self.write(|fleet| async move {
            if let Some(model) = fleet.committed().model(&deploy.model) {
                super::authority::check_serving(
                    &caller,
                    model,
                    deploy.serving.args(),
                    deploy.serving.env(),
                )?;
            }
            let Sharing::Shared {
                share,
                shares,
                revision,
                demand,
                demands,
                replicas,
            } = &deploy.sharing
            else {
                return fleet.deploy_whole(&deploy, &actor).await;
            };
            let chosen = deploy.gpus.gpus();
            let mut state = fleet.state.lock().await;
            let committed = state.committed.clone();
            let model = committed.undeployed_model(&deploy.model)?;
            let system = committed.system_models();
            let on_nodes: Vec<&str> = committed
                .groups
                .iter()
                .filter(|g| g.gpus.iter().any(|gpu| chosen.contains(gpu)))
                .map(|g| g.name.as_str())
                .collect();
            let choice = choose_group(&model.name, model.group.as_deref(), &on_nodes)
                .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
            let share = share.unwrap_or(model.default_share);
            let (mut group, mut plan, moving) = match &choice {
                GroupChoice::Join(name) => {
                    let group = committed
                        .group(name)
                        .cloned()
                        .ok_or_else(|| no_group(name))?;
                    check_revision(&group, *revision)?;
                    let plan = plan_with(&group, &system, shares, demands, true)?;
                    (group, plan, None)
                }
                GroupChoice::New { name, .. } => {
                    if committed.group(name).is_some() {
                        return Err(ApiError::Conflict(format!(
                            "a group named {name} runs on other GPUs; choose its GPUs to join it"
                        )));
                    }
                    let inventory = state.ledger.inventory();
                    placement::check_new_group(inventory, chosen)
                        .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
                    // The router moves out of the group it runs in, with its share, into the new one.
                    let router = committed.groups.iter().find_map(|g| {
                        g.members
                            .iter()
                            .find(|s| system.contains(&s.member))
                            .map(|s| (Group::clone(g), s.clone()))
                    });
                    let plan = router
                        .iter()
                        .map(|(_, s)| PlanMember {
                            locked: true,
                            ..PlanMember::new(&s.member, s.share)
                        })
                        .collect();
                    let group = Group {
                        name: name.clone(),
                        gpus: placement::group_gpus(inventory, chosen),
                        revision: 0,
                        members: Vec::new(),
                        serving: BTreeMap::new(),
                        demand: BTreeMap::new(),
                        loaded: BTreeSet::new(),
                        autoscale: BTreeMap::new(),
                        placed: BTreeMap::new(),
                        asleep: BTreeMap::new(),
                    };
                    (group, plan, router)
                }
            };
            if model.system && demand.is_on_demand() {
                return Err(router_stays_pinned(&model.name));
            }
            if model.system && replicas.is_some() {
                return Err(router_runs_everywhere(&model.name));
            }
            plan.push(PlanMember {
                locked: model.system,
                demand: *demand,
                replicas: *replicas,
                ..PlanMember::new(&model.name, share)
            });
            if let Some(replicas) = replicas {
                let replicas = replicas
                    .within(group.gpus.len() as u32)
                    .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
                group.autoscale.insert(model.name.clone(), replicas);
                // Its first replicas, by best fit, beside what the ledger holds there.
                let placed = super::replicas::first_placed(
                    &state.ledger,
                    &group,
                    &model.name,
                    share,
                    replicas.min(),
                );
                group.placed.insert(model.name.clone(), placed);
            }
            let serving = Serving::from(deploy.serving.clone());
            let mut change = fleet
                .commit(
                    &mut state,
                    &group,
                    plan,
                    moving,
                    Some((&model.name, serving)),
                    Note::new(&actor, "deploy", &model.name),
                )
                .await?;
            change.line = Some(choice.line());
            Ok(change)
        })
        .await
    }

    /// Deploys a model on whole GPUs of one machine: a worker named after the model that holds exactly the
    /// GPUs chosen, placed at once or refused with the reasons. Inside [`Fleet::write`].
    pub(crate) async fn deploy_whole(
        &self,
        deploy: &DeployCommand,
        actor: &str,
    ) -> Result<PlanChange, ApiError> {
        let chosen = deploy.gpus.gpus();
        if chosen.iter().any(|g| g.machine != chosen[0].machine) {
            return Err(ApiError::Unprocessable(
                "a model on whole GPUs runs on one machine: choose GPUs of one node".to_owned(),
            ));
        }
        let new = NewWorker::parse(
            deploy.model.clone(),
            RequestedResources {
                cpu_cores: None,
                memory_bytes: None,
                gpu_requests: Some(GpuRequests {
                    count: Some(chosen.len() as f64),
                    ids: chosen.iter().map(GpuRef::id).collect(),
                    ..GpuRequests::default()
                }),
            },
            None,
            deploy.serving.env().clone(),
        )?;
        let run = ModelRun {
            model: deploy.model.clone(),
            args: deploy.serving.args().to_vec(),
        };
        let worker = self.accept_worker(new, Some(run), actor).await?;
        let on: Vec<String> = worker
            .gpus
            .iter()
            .map(|i| GpuRef::new(worker.machine.clone().unwrap_or_default(), *i).to_string())
            .collect();
        Ok(PlanChange {
            group: None,
            revision: worker.revision,
            line: Some(format!("The model takes whole GPUs: {}.", on.join(", "))),
            restarts: vec![Restart {
                member: deploy.model.clone(),
                change: placement::Change::Joins,
            }],
            steps: vec![Step::Start(deploy.model.clone(), BasisPoints::WHOLE)],
            warning: None,
            waits: Vec::new(),
        })
    }

    /// Removes a deployed model, read at `revision`: a group's member leaves its plan (the others keep their
    /// shares and run on; the group ends with its last member), a model on whole GPUs frees them. The
    /// semantic router stays: every group's requests go through it.
    pub async fn remove_deployment(
        self: &Arc<Self>,
        model: &str,
        revision: i64,
        actor: &str,
    ) -> Result<PlanChange, ApiError> {
        let (model, actor) = (model.to_owned(), actor.to_owned());
        self.write(|fleet| async move {
            let mut state = fleet.state.lock().await;
            let system = state.committed.system_models();
            match deployed(&state.committed, &model).ok_or_else(|| super::not_deployed(&model))? {
                Deployed::Whole(worker) => {
                    fleet
                        .end_worker(&mut state, &worker.name, Some(revision), &actor)
                        .await?;
                    Ok(PlanChange {
                        group: None,
                        revision,
                        line: None,
                        restarts: vec![Restart {
                            member: model.clone(),
                            change: placement::Change::Leaves,
                        }],
                        steps: vec![Step::Stop(model.clone())],
                        warning: None,
                        waits: Vec::new(),
                    })
                }
                Deployed::Group(_) if system.contains(&model) => {
                    Err(ApiError::Unprocessable(format!(
                        "{model} is the semantic router, which every group's requests go through: it is not removed from here"
                    )))
                }
                Deployed::Group(group) => {
                    check_revision(&group, Some(revision))?;
                    let plan = group
                        .plan(&system)
                        .into_iter()
                        .filter(|m| m.name != model)
                        .collect();
                    let note = Note::new(&actor, "deployment.remove", &model);
                    let change = fleet
                        .commit(&mut state, &group, plan, None, None, note)
                        .await?;
                    // Its load and decisions go with it: a model deployed again under its name starts afresh.
                    fleet.scaling.forget(&model);
                    Ok(change)
                }
            }
        })
        .await
    }

    /// Changes a deployed model's serving configuration, read at `revision`. Its engines restart with it;
    /// nothing else restarts.
    pub async fn change_serving(
        self: &Arc<Self>,
        model: &str,
        revision: i64,
        serving: ServingSettings,
        actor: &Caller,
    ) -> Result<ServingChange, ApiError> {
        let mut serving = Serving::from(serving);
        if let Some(Deployed::Group(group)) = self.deployed(model) {
            if let Some(member) = group.members.iter().find(|m| m.member == model) {
                self.judge_given_context(model, &serving.args, &group.gpus, member.share)
                    .await?;
            }
        }
        let caller = actor.clone();
        let (model, actor) = (model.to_owned(), actor.name.clone());
        self.write(|fleet| async move {
            let mut state = fleet.state.lock().await;
            let (before_args, before_env) = fleet.serving_of(&model)?;
            // A form that showed a secret redacted sends it back so: the stored value stays.
            keep_secrets(&mut serving.env, &before_env);
            let marked = match state.committed.model(&model) {
                Some(recipe) => {
                    check_model_serving(&caller, recipe, &serving.args, &serving.env)?;
                    recipe.secret_env.clone()
                }
                None => Vec::new(),
            };
            let args = serde_json::to_string(&serving.args).map_err(ApiError::internal)?;
            let env = serde_json::to_string(&serving.env).map_err(ApiError::internal)?;
            let mut tx = crate::db::write(&fleet.pool).await?;
            let (group, new_revision) =
                match deployed(&state.committed, &model).ok_or_else(|| super::not_deployed(&model))? {
                    Deployed::Group(group) => {
                        check_revision(&group, Some(revision))?;
                        sqlx::query("UPDATE group_members SET args = ?, env = ? WHERE model = ?")
                            .bind(&args)
                            .bind(&env)
                            .bind(&model)
                            .execute(&mut *tx)
                            .await?;
                        sqlx::query("UPDATE groups SET revision = revision + 1 WHERE name = ?")
                            .bind(&group.name)
                            .execute(&mut *tx)
                            .await?;
                        (Some(group.name), group.revision + 1)
                    }
                    Deployed::Whole(worker) => {
                        if worker.revision != revision {
                            return Err(ApiError::Conflict(format!(
                                "{model} is at revision {}, not {}; read it again and retry",
                                worker.revision, revision
                            )));
                        }
                        sqlx::query(
                            "UPDATE workers SET args = ?, env = ?, revision = revision + 1 WHERE name = ?",
                        )
                        .bind(&args)
                        .bind(&env)
                        .bind(&worker.name)
                        .execute(&mut *tx)
                        .await?;
                        (None, worker.revision + 1)
                    }
                };
            crate::audit::record(
                &mut tx,
                Entry::new(&actor, "serving.change", &model)
                    .before(serde_json::json!({ "args": redact_args(&before_args), "env": redact_env(&before_env, &marked) }))
                    .after(serde_json::json!({ "args": redact_args(&serving.args), "env": redact_env(&serving.env, &marked) }))
                    .revision(new_revision)
                    .restarts(vec![model.clone()]),
            )
            .await?;
            // Its engines now run as something else, so the runtime restarts exactly them.
            fleet.finish(&mut state, tx, None, None).await?;
            Ok(ServingChange {
                restarts: vec![model.clone()],
                model,
                group,
                revision: new_revision,
            })
        })
        .await
    }
}

/// Where `model` runs in `committed`, if it runs.
fn deployed(committed: &Committed, model: &str) -> Option<Deployed> {
    if let Some(group) = committed.group_of(model) {
        return Some(Deployed::Group(Box::new(group.clone())));
    }
    committed
        .whole_deployment(model)
        .cloned()
        .map(|w| Deployed::Whole(Box::new(w)))
}

#[cfg(test)]
mod tests;
