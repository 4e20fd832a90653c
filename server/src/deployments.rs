//! A deployed catalog model, wherever it runs: as a member of a sharing group, or on whole GPUs (a worker
//! that names its model). Removing one, and changing its serving configuration, which restarts it alone.

use crate::audit::Entry;
use crate::db::{self, WorkerRow};
use crate::error::ApiError;
use crate::fleet::{check_name, Fleet, ModelRun, NewWorker};
use crate::groups::{check_revision, check_serving, load_groups, Deploy, Group, Note, PlanChange};
use crate::inventory::demo::CatalogModel;
use placement::{BasisPoints, GpuRequests, PlanMember, RequestedResources, Restart, Step};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a deployed model runs.
pub(crate) enum Deployed {
    /// In a sharing group.
    Group(Group),
    /// On whole GPUs, as this worker.
    Whole(WorkerRow),
}

/// `PUT /api/deployments/{model}/serving`: the whole serving configuration, read at `revision` (the
/// group's, or the worker's for a model on whole GPUs).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingUpdate {
    /// The revision it was read at.
    pub revision: i64,
    /// Extra arguments for its engine.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables for its engine.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
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
    /// The worker that runs `model` on whole GPUs, if one does.
    pub(crate) async fn whole_deployment(
        &self,
        model: &str,
    ) -> Result<Option<crate::fleet::WorkerView>, ApiError> {
        Ok(self
            .workers()
            .into_iter()
            .find(|w| w.model.as_deref() == Some(model)))
    }

    /// Where `model` runs, if it runs.
    pub(crate) async fn deployed(&self, model: &str) -> Result<Option<Deployed>, ApiError> {
        if let Some(group) = load_groups(&self.pool)
            .await?
            .into_iter()
            .find(|g| g.members.iter().any(|s| s.member == model))
        {
            return Ok(Some(Deployed::Group(group)));
        }
        Ok(db::workers(&self.pool)
            .await?
            .into_iter()
            .find(|w| w.model.as_deref() == Some(model))
            .map(Deployed::Whole))
    }

    /// A deployed model's own serving configuration: extra arguments and environment variables.
    pub(crate) async fn serving_of(
        &self,
        model: &str,
    ) -> Result<(Vec<String>, BTreeMap<String, String>), ApiError> {
        let row: Option<(String, String)> = match self.deployed(model).await? {
            Some(Deployed::Group(_)) => {
                sqlx::query_as("SELECT args, env FROM group_members WHERE model = ?")
                    .bind(model)
                    .fetch_optional(&self.pool)
                    .await?
            }
            Some(Deployed::Whole(worker)) => Some((worker.args, worker.env)),
            None => None,
        };
        let (args, env) = row.ok_or_else(|| not_deployed(model))?;
        Ok((
            serde_json::from_str(&args).map_err(ApiError::internal)?,
            serde_json::from_str(&env).map_err(ApiError::internal)?,
        ))
    }

    /// Deploys `model` on whole GPUs of one machine: a worker named after the model that holds exactly the
    /// GPUs chosen, placed at once or refused with the reasons.
    pub(crate) async fn deploy_whole(
        &self,
        model: &CatalogModel,
        deploy: &Deploy,
        actor: &str,
    ) -> Result<PlanChange, ApiError> {
        if deploy.share.is_some() || !deploy.shares.is_empty() || deploy.revision.is_some() {
            return Err(ApiError::Unprocessable(
                "a deploy on whole GPUs takes no share, shares or revision; leave them out, or deploy with \"shared\": true".to_owned(),
            ));
        }
        let gpus = deploy
            .gpus
            .iter()
            .map(|id| crate::api::parse_gpu_ref(id))
            .collect::<Result<Vec<_>, _>>()?;
        if gpus.iter().any(|g| g.machine != gpus[0].machine) {
            return Err(ApiError::Unprocessable(
                "a model on whole GPUs runs on one machine: choose GPUs of one node".to_owned(),
            ));
        }
        check_name(&model.name)?;
        if self.worker(&model.name).is_ok() {
            return Err(ApiError::Conflict(format!(
                "a worker named {} exists; remove it before deploying the model on whole GPUs",
                model.name
            )));
        }
        let new = NewWorker {
            name: model.name.clone(),
            requested_resources: RequestedResources {
                cpu_cores: None,
                memory_bytes: None,
                gpu_requests: Some(GpuRequests {
                    count: Some(gpus.len() as f64),
                    ids: gpus
                        .iter()
                        .map(|g| format!("{}:{}", g.machine, g.index))
                        .collect(),
                    ..GpuRequests::default()
                }),
            },
            command: None,
            env: deploy.env.clone(),
        };
        let run = ModelRun {
            model: model.name.clone(),
            args: deploy.args.clone(),
        };
        let worker = self.accept_worker(new, Some(run), actor).await?;
        let on: Vec<String> = worker
            .gpus
            .iter()
            .map(|i| {
                placement::GpuRef::new(worker.machine.clone().unwrap_or_default(), *i).to_string()
            })
            .collect();
        Ok(PlanChange {
            group: None,
            revision: worker.revision,
            line: Some(format!("The model takes whole GPUs: {}.", on.join(", "))),
            restarts: vec![Restart {
                member: model.name.clone(),
                change: placement::Change::Joins,
            }],
            steps: vec![Step::Start(model.name.clone(), BasisPoints::WHOLE)],
            warning: None,
        })
    }

    /// Removes a deployed model, read at `revision`: a group's member leaves its plan (the others keep their
    /// shares and run on; the group ends with its last member), a model on whole GPUs frees them. The
    /// semantic router stays: every group's requests go through it.
    pub async fn remove_deployment(
        &self,
        model: &str,
        revision: i64,
        actor: &str,
    ) -> Result<PlanChange, ApiError> {
        let system = self.system_models().await?;
        match self.deployed(model).await?.ok_or_else(|| not_deployed(model))? {
            Deployed::Whole(worker) => {
                self.delete_worker(&worker.name, Some(revision), actor)
                    .await?;
                Ok(PlanChange {
                    group: None,
                    revision,
                    line: None,
                    restarts: vec![Restart {
                        member: model.to_owned(),
                        change: placement::Change::Leaves,
                    }],
                    steps: vec![Step::Stop(model.to_owned())],
                    warning: None,
                })
            }
            Deployed::Group(_) if system.iter().any(|s| s == model) => {
                Err(ApiError::Unprocessable(format!(
                    "{model} is the semantic router, which every group's requests go through: it is not removed from here"
                )))
            }
            Deployed::Group(_) => {
                let mut scheduler = self.scheduler.lock().await;
                // Read again under the lock: the group may have changed since.
                let group = load_groups(&self.pool)
                    .await?
                    .into_iter()
                    .find(|g| g.members.iter().any(|s| s.member == model))
                    .ok_or_else(|| not_deployed(model))?;
                check_revision(&group, Some(revision))?;
                let plan = group
                    .members
                    .iter()
                    .filter(|s| s.member != model)
                    .map(|s| PlanMember {
                        name: s.member.clone(),
                        share: Some(s.share),
                        locked: system.contains(&s.member),
                    })
                    .collect();
                let note = Note::new(actor, "deployment.remove", model);
                self.commit(&mut scheduler, &group, plan, None, None, note)
                    .await
            }
        }
    }

    /// Changes a deployed model's serving configuration, read at `revision`. Its engines restart with it;
    /// nothing else restarts.
    pub async fn change_serving(
        &self,
        model: &str,
        update: ServingUpdate,
        actor: &str,
    ) -> Result<ServingChange, ApiError> {
        check_serving(&update.args, &update.env)?;
        let args = serde_json::to_string(&update.args).map_err(ApiError::internal)?;
        let env = serde_json::to_string(&update.env).map_err(ApiError::internal)?;
        let scheduler = self.scheduler.lock().await;
        let (before_args, before_env) = self.serving_of(model).await?;
        let mut tx = crate::db::write(&self.pool).await?;
        let (group, revision) = match self
            .deployed(model)
            .await?
            .ok_or_else(|| not_deployed(model))?
        {
            Deployed::Group(group) => {
                check_revision(&group, Some(update.revision))?;
                sqlx::query("UPDATE group_members SET args = ?, env = ? WHERE model = ?")
                    .bind(&args)
                    .bind(&env)
                    .bind(model)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query("UPDATE groups SET revision = revision + 1 WHERE name = ?")
                    .bind(&group.name)
                    .execute(&mut *tx)
                    .await?;
                (Some(group.name), group.revision + 1)
            }
            Deployed::Whole(worker) => {
                if worker.revision != update.revision {
                    return Err(ApiError::Conflict(format!(
                        "{model} is at revision {}, not {}; read it again and retry",
                        worker.revision, update.revision
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
            Entry::new(actor, "serving.change", model)
                .before(serde_json::json!({ "args": before_args, "env": before_env }))
                .after(serde_json::json!({ "args": update.args, "env": update.env }))
                .revision(revision)
                .restarts(vec![model.to_owned()]),
        )
        .await?;
        tx.commit().await?;
        self.publish(&scheduler).await?;
        // Its engines now run as something else, so the runtime restarts exactly them.
        self.sync_engines(&scheduler).await;
        Ok(ServingChange {
            model: model.to_owned(),
            group,
            revision,
            restarts: vec![model.to_owned()],
        })
    }
}

fn not_deployed(model: &str) -> ApiError {
    ApiError::NotFound(format!(
        "{model} is not deployed; GET /api/groups and GET /api/workers list what runs"
    ))
}

#[cfg(test)]
mod tests;
