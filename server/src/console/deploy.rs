//! Deploying and changing what runs: the deploy wizard's options, the sharing and serving forms, and the
//! changes they send (deploy, shares, serving, remove), each turned into the fleet's typed command.

use super::machines::node_options;
use super::{app_error, whole_deployments, ConsoleService};
use crate::error::ApiError;
use crate::fleet::authority;
use crate::fleet::deployments::Deployed;
use crate::fleet::groups::{Group, PlanChange};
use crate::input::{DeployCommand, PlanCommand, ServingSettings, Sharing};
use app::auth::{Caller, Role};
use app::error::AppError;
use app::views::{
    CatalogEntry, ChangeOutcome, DeployOptions, DeployRequest, EstimateAnswer, EstimateQuery,
    GroupPlan, Serving, ServingForm, SharingForm,
};
use placement::{BasisPoints, Demand, GpuChoice, GpuRef};
use std::collections::BTreeMap;

fn plan_of(group: &Group, system: &[String]) -> GroupPlan {
    GroupPlan {
        name: group.name.clone(),
        revision: group.revision,
        gpus: group.gpus.clone(),
        members: group.plan(system),
        unloaded: group.unloaded(),
    }
}

impl ConsoleService {
    pub(super) async fn options(&self) -> Result<DeployOptions, ApiError> {
        let committed = self.fleet.committed();
        let groups = &committed.groups;
        let system = committed.system_models();
        let workers = self.fleet.workers();
        let catalog = self
            .fleet
            .models()
            .into_iter()
            .map(|m| CatalogEntry {
                deployed: groups
                    .iter()
                    .any(|g| g.members.iter().any(|s| s.member == m.name))
                    || whole_deployments(&workers).any(|w| w.model.as_ref() == Some(&m.name)),
                engine: crate::fleet::groups::engine_name(m.engine).to_owned(),
                default_share: m.default_share,
                group: m.group,
                system: m.system,
                name: m.name,
            })
            .collect();
        Ok(DeployOptions {
            catalog,
            nodes: node_options(&self.fleet.machines()),
            groups: groups.iter().map(|g| plan_of(g, &system)).collect(),
        })
    }

    /// The wizard's estimate: a model the fleet cannot read gets the reason, shown in place of numbers.
    pub(super) async fn estimate_model(
        &self,
        query: EstimateQuery,
    ) -> Result<EstimateAnswer, ApiError> {
        let settings =
            placement::estimate::Settings::chosen(query.context, query.slots, &query.cache_type)
                .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
        match self
            .fleet
            .estimate_model(&query.model, query.machine.as_deref(), settings)
            .await
        {
            Ok(estimate) => Ok(EstimateAnswer::Estimated(Box::new(estimate))),
            Err(ApiError::Unprocessable(reason)) => Ok(EstimateAnswer::NotEstimated(reason)),
            Err(e) => Err(e),
        }
    }

    pub(super) async fn sharing(&self, model: &str) -> Result<SharingForm, ApiError> {
        let group = match self.fleet.deployed(model) {
            Some(Deployed::Group(group)) => group,
            Some(Deployed::Whole(_)) => {
                return Err(ApiError::Unprocessable(format!(
                    "{model} runs on whole GPUs, so it has no share to change; remove it and deploy it with GPU sharing on to share"
                )))
            }
            None => return Err(not_running(model)),
        };
        let system = self.fleet.system_models();
        let mut gpus = Vec::with_capacity(group.gpus.len());
        for gpu in &group.gpus {
            gpus.push(self.fleet.group_gpu(gpu, Some(&group.name)).await?);
        }
        let engines = self
            .fleet
            .models()
            .into_iter()
            .filter(|m| group.members.iter().any(|s| s.member == m.name))
            .map(|m| {
                (
                    m.name,
                    crate::fleet::groups::engine_name(m.engine).to_owned(),
                )
            })
            .collect();
        Ok(SharingForm {
            model: model.to_owned(),
            group: plan_of(&group, &system),
            gpus,
            engines,
        })
    }

    /// The serving form, its secrets redacted for everyone but admins.
    pub(super) async fn serving(
        &self,
        caller: &Caller,
        model: &str,
    ) -> Result<ServingForm, ApiError> {
        let (group, revision, placed) = match self.fleet.deployed(model) {
            Some(Deployed::Group(group)) => {
                (Some(group.name.clone()), group.revision, group.gpus.clone())
            }
            Some(Deployed::Whole(worker)) => {
                let view = self.fleet.worker(&worker.name)?;
                let machine = view.machine.clone().unwrap_or_default();
                let placed = view
                    .gpus
                    .iter()
                    .map(|i| GpuRef::new(&machine, *i))
                    .collect();
                (None, worker.revision, placed)
            }
            None => return Err(not_running(model)),
        };
        let (mut args, mut env) = self.fleet.serving_of(model)?;
        let engine = self
            .fleet
            .models()
            .into_iter()
            .find(|m| m.name == model)
            .map(|m| crate::fleet::groups::engine_name(m.engine).to_owned())
            .unwrap_or_default();
        if caller.role != Role::Admin {
            let marked = self.fleet.secret_env_of(model);
            env = authority::redact_env(&env, &marked);
            args = authority::redact_args(&args);
        }
        Ok(ServingForm {
            model: model.to_owned(),
            engine,
            group,
            revision,
            nodes: node_options(&self.fleet.machines()),
            placed,
            serving: Serving {
                args,
                env: env.into_iter().collect(),
            },
        })
    }

    pub(super) async fn deploy_model(
        &self,
        actor: Caller,
        request: DeployRequest,
    ) -> Result<ChangeOutcome, AppError> {
        let sharing = Sharing::new(
            request.shared,
            request.share,
            request.shares.into_iter().collect(),
            request.revision,
            request.demand,
            request.demands.into_iter().collect(),
            request.replicas,
        );
        let deploy = DeployCommand {
            model: request.model,
            gpus: GpuChoice::new(request.gpus)
                .map_err(|e| app_error(ApiError::Unprocessable(e.to_string())))?,
            sharing: sharing.map_err(app_error)?,
            serving: serving_settings(request.serving).map_err(app_error)?,
        };
        self.fleet
            .deploy(deploy, &actor)
            .await
            .map(outcome)
            .map_err(app_error)
    }

    pub(super) async fn change_plan(
        &self,
        actor: Caller,
        group: String,
        revision: i64,
        shares: Vec<(String, BasisPoints)>,
        demand: Vec<(String, Demand)>,
    ) -> Result<ChangeOutcome, AppError> {
        let update = PlanCommand {
            revision,
            shares: shares.into_iter().collect(),
            demand: demand.into_iter().collect(),
        };
        self.fleet
            .change_plan(&group, update, &actor.name)
            .await
            .map(outcome)
            .map_err(app_error)
    }

    pub(super) async fn change_model_serving(
        &self,
        actor: Caller,
        model: String,
        revision: i64,
        serving: Serving,
    ) -> Result<ChangeOutcome, AppError> {
        let serving = serving_settings(serving).map_err(app_error)?;
        let change = self
            .fleet
            .change_serving(&model, revision, serving, &actor)
            .await
            .map_err(app_error)?;
        Ok(ChangeOutcome {
            group: change.group,
            restarts: change.restarts,
            warning: None,
        })
    }

    pub(super) async fn change_model_replicas(
        &self,
        actor: Caller,
        model: String,
        revision: i64,
        fewest: String,
        most: String,
    ) -> Result<app::views::ReplicasSaved, AppError> {
        let (now, gpus) = self.fleet.replicas_setting(&model).map_err(app_error)?;
        let typed = placement::scale::Autoscale::typed(&fewest, &most, gpus)
            .map_err(|e| AppError::Refused(e.to_string()))?;
        // A model with replicas keeps its target and windows; one taking them has the defaults.
        let replicas = match (now, typed) {
            (Some(now), Some(typed)) => Some(
                now.with_bounds(typed.min(), typed.max())
                    .map_err(|e| AppError::Refused(e.to_string()))?,
            ),
            (_, typed) => typed,
        };
        self.fleet
            .change_replicas(&model, revision, replicas, &actor.name)
            .await
            .map(|change| app::views::ReplicasSaved {
                replicas: change.replicas,
                restarts: change.restarts,
                unloaded: change.unloaded,
                warning: change.warning,
                waits: change.waits,
            })
            .map_err(app_error)
    }

    pub(super) async fn remove_model(
        &self,
        actor: Caller,
        model: String,
        revision: i64,
    ) -> Result<ChangeOutcome, AppError> {
        self.fleet
            .remove_deployment(&model, revision, &actor.name)
            .await
            .map(outcome)
            .map_err(app_error)
    }
}

fn not_running(model: &str) -> ApiError {
    ApiError::NotFound(format!(
        "{model} does not run; the Models tab lists what runs"
    ))
}

/// A form's serving configuration, read once: environment variables as a map, refusing a name given twice.
fn serving_settings(serving: Serving) -> Result<ServingSettings, ApiError> {
    let mut env = BTreeMap::new();
    for (name, value) in serving.env {
        if env.insert(name.clone(), value).is_some() {
            return Err(ApiError::Unprocessable(format!(
                "the environment variable {name} is set twice; keep one"
            )));
        }
    }
    ServingSettings::parse(serving.args, env)
}

fn outcome(change: PlanChange) -> ChangeOutcome {
    ChangeOutcome {
        group: change.group,
        restarts: change.restarts.into_iter().map(|r| r.member).collect(),
        warning: change.warning,
    }
}
