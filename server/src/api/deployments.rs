//! Deployments: a catalog model onto shared or whole GPUs, its removal, and its serving configuration.

use super::{percent, percents, ApiJson};
use crate::auth::Actor;
use crate::error::ApiError;
use crate::fleet::deployments::ServingChange;
use crate::fleet::groups::PlanChange;
use crate::input::{DeployCommand, ServingSettings, Sharing};
use crate::AppState;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use placement::Demand;
use serde::Deserialize;
use std::collections::BTreeMap;

pub(super) async fn deploy(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(deploy): ApiJson<Deploy>,
) -> Result<(StatusCode, Json<PlanChange>), ApiError> {
    let deploy = deploy.parse()?;
    Ok((
        StatusCode::CREATED,
        Json(state.fleet.deploy(deploy, &actor).await?),
    ))
}

/// `?revision=N`: required, the revision the deployment was read at.
#[derive(Debug, Deserialize)]
pub(super) struct RequiredRevision {
    revision: i64,
}

/// `DELETE /api/deployments/{model}?revision=N`: the model stops; a group's other members keep their
/// shares. 200 with what stops.
pub(super) async fn remove_deployment(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(model): Path<String>,
    query: Result<Query<RequiredRevision>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<PlanChange>, ApiError> {
    let Query(query) = query.map_err(|_| {
        ApiError::BadRequest(
            "name the revision you read as ?revision=N (the group's, or the worker's on whole GPUs)"
                .to_owned(),
        )
    })?;
    Ok(Json(
        state
            .fleet
            .remove_deployment(&model, query.revision, &actor.name)
            .await?,
    ))
}

/// `PUT /api/deployments/{model}/serving`: the model's extra arguments and environment; it restarts alone.
pub(super) async fn change_serving(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(model): Path<String>,
    ApiJson(update): ApiJson<ServingUpdate>,
) -> Result<Json<ServingChange>, ApiError> {
    Ok(Json(
        state
            .fleet
            .change_serving(&model, update.revision, update.serving()?, &actor)
            .await?,
    ))
}

/// `PUT /api/deployments/{model}/replicas`: a model's replicas; no engine restarts unless it takes them or
/// gives them up (`null`).
pub(super) async fn change_replicas(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(model): Path<String>,
    ApiJson(update): ApiJson<ReplicasUpdate>,
) -> Result<Json<crate::fleet::replicas::ReplicasChange>, ApiError> {
    let replicas = update
        .replicas
        .map(placement::scale::Autoscale::try_from)
        .transpose()
        .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
    Ok(Json(
        state
            .fleet
            .change_replicas(&model, update.revision, replicas, &actor.name)
            .await?,
    ))
}

/// `PUT /api/deployments/{model}/replicas`: the model's replicas, read at its group's `revision`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicasUpdate {
    /// The group's revision it was read at.
    pub revision: i64,
    /// Its replicas: `{"min": 1, "max": 4}`, and `target`, `up_s`, `down_s` where set; `null` for none (an
    /// engine on each machine of its group). Required: a body that leaves it out changes nothing.
    #[serde(deserialize_with = "present")]
    pub replicas: Option<placement::scale::Wire>,
}

/// A field that must be there, `null` or not.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::deserialize(d)
}

/// `POST /api/deployments`: a catalog model onto a share of the chosen GPUs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deploy {
    /// The catalog model.
    pub model: String,
    /// The GPUs, as `machine:index`.
    pub gpus: Vec<String>,
    /// Share the GPUs with a group (the default), or take them whole (`false`: one machine's GPUs).
    #[serde(default = "sharing_by_default")]
    pub shared: bool,
    /// Its share, percent; the catalog's default share when absent.
    #[serde(default)]
    pub share: Option<f64>,
    /// New shares for other members of the group it joins, percent.
    #[serde(default)]
    pub shares: BTreeMap<String, f64>,
    /// The revision of the group it joins; required when it joins one.
    #[serde(default)]
    pub revision: Option<i64>,
    /// Always loaded (`{"mode": "pinned"}`, the default), or loaded when a request asks for it
    /// (`{"mode": "on_demand", "keep_alive": 300}`, seconds).
    #[serde(default)]
    pub demand: Demand,
    /// New demand for other members of the group it joins, as in a plan change.
    #[serde(default)]
    pub demands: BTreeMap<String, Demand>,
    /// Serving configuration: arguments added to the model's recipe.
    #[serde(default)]
    pub args: Vec<String>,
    /// Serving configuration: environment variables added to the model's recipe.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Replicas that follow its load (`{"min": 1, "max": 4}`), each on a GPU of its own of its group;
    /// none: an engine on each machine of its group, across its GPUs there.
    #[serde(default)]
    pub replicas: Option<placement::scale::Wire>,
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

fn sharing_by_default() -> bool {
    true
}

impl Deploy {
    /// The deploy as the fleet takes it: GPUs, shares, sharing and serving settings read once.
    pub fn parse(self) -> Result<DeployCommand, ApiError> {
        let gpus = placement::parse_gpu_list(&self.gpus)
            .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
        let share = self.share.map(|p| percent(p, &self.model)).transpose()?;
        Ok(DeployCommand {
            sharing: Sharing::new(
                self.shared,
                share,
                percents(self.shares)?,
                self.revision,
                self.demand,
                self.demands,
                self.replicas
                    .map(placement::scale::Autoscale::try_from)
                    .transpose()
                    .map_err(|e| ApiError::Unprocessable(e.to_string()))?,
            )?,
            model: self.model,
            gpus,
            serving: ServingSettings::parse(self.args, self.env)?,
        })
    }
}

impl ServingUpdate {
    /// The serving configuration it sets, read once.
    pub fn serving(self) -> Result<ServingSettings, ApiError> {
        ServingSettings::parse(self.args, self.env)
    }
}
