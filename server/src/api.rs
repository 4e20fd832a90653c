//! The REST API for scripts: JSON in, JSON out, errors as `{"error": "..."}` with the right status.

use crate::error::ApiError;
use crate::fleet::{MachineView, NewWorker, WorkerView};
use crate::AppState;
use axum::extract::{FromRequest, Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use placement::{judge, BasisPoints, GpuRef, GroupGpu, PlanMember};
use serde::{Deserialize, Serialize};

/// JSON whose rejection is an [`ApiError`], so that a malformed body gets our error shape.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// The routes under `/api`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/workers", post(create_worker).get(list_workers))
        .route("/api/workers/{name}", get(get_worker).delete(delete_worker))
        .route("/api/machines", get(list_machines))
        .route("/api/machines/{name}", get(get_machine))
        .route("/api/machines/{name}/workers", get(machine_workers))
        .route("/api/plans/validate", post(validate_plan))
}

async fn create_worker(
    State(state): State<AppState>,
    ApiJson(new): ApiJson<NewWorker>,
) -> Result<(StatusCode, Json<WorkerView>), ApiError> {
    Ok((
        StatusCode::CREATED,
        Json(state.fleet.create_worker(new).await?),
    ))
}

async fn list_workers(State(state): State<AppState>) -> Result<Json<Vec<WorkerView>>, ApiError> {
    Ok(Json(state.fleet.workers().await?))
}

async fn get_worker(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<WorkerView>, ApiError> {
    Ok(Json(state.fleet.worker(&name).await?))
}

/// `?revision=N`: delete only if the worker is still at revision N.
#[derive(Debug, Deserialize)]
struct RevisionQuery {
    revision: Option<i64>,
}

async fn delete_worker(
    State(state): State<AppState>,
    Path(name): Path<String>,
    query: Result<Query<RevisionQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let Query(query) = query.map_err(|_| {
        ApiError::BadRequest("revision must be a whole number, such as ?revision=2".to_owned())
    })?;
    state.fleet.delete_worker(&name, query.revision).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_machines(State(state): State<AppState>) -> Json<Vec<MachineView>> {
    Json(state.fleet.machines().await)
}

async fn get_machine(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<MachineView>, ApiError> {
    Ok(Json(state.fleet.machine(&name).await?))
}

async fn machine_workers(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Vec<WorkerView>>, ApiError> {
    Ok(Json(state.fleet.machine_workers(&name).await?))
}

/// `POST /api/plans/validate`: a group's members with their shares in percent, and the GPUs it runs on.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanRequest {
    members: Vec<PlanMemberRequest>,
    /// GPUs as `machine:index`.
    #[serde(default)]
    gpus: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanMemberRequest {
    name: String,
    /// Percent of one GPU's memory; absent or null for a member with no share yet.
    #[serde(default)]
    share: Option<f64>,
    #[serde(default)]
    locked: bool,
}

/// The verdict as scripts read it.
#[derive(Debug, Serialize, Deserialize)]
struct VerdictView {
    /// `fits` or `refused`.
    verdict: String,
    total_percent: f64,
    free_percent: f64,
    /// The line under the bar when it fits.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// The Free row's warning over 90 %.
    #[serde(skip_serializing_if = "Option::is_none")]
    warning: Option<String>,
    problems: Vec<ProblemView>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ProblemView {
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    member: Option<String>,
}

async fn validate_plan(
    State(state): State<AppState>,
    ApiJson(plan): ApiJson<PlanRequest>,
) -> Result<Json<VerdictView>, ApiError> {
    let mut members = Vec::with_capacity(plan.members.len());
    for m in &plan.members {
        let share = m
            .share
            .map(BasisPoints::from_percent)
            .transpose()
            .map_err(|e| {
                ApiError::Unprocessable(format!(
                    "the share of {} {e}; give a percentage such as 33.33",
                    m.name
                ))
            })?;
        members.push(PlanMember {
            name: m.name.clone(),
            share,
            locked: m.locked,
        });
    }
    let names: Vec<String> = members.iter().map(|m| m.name.clone()).collect();
    let inventory = state.fleet.inventory().await;
    let mut gpus = Vec::with_capacity(plan.gpus.len());
    for id in &plan.gpus {
        let gpu_ref = id
            .split_once(':')
            .and_then(|(m, i)| Some(GpuRef::new(m, i.parse().ok()?)))
            .ok_or_else(|| {
                ApiError::Unprocessable(format!(
                    "GPU {id:?}: name it as machine:index, such as majin:0"
                ))
            })?;
        let gpu = inventory
            .gpu(&gpu_ref)
            .ok_or_else(|| ApiError::Unprocessable(format!("{gpu_ref} is not in the inventory")))?;
        let taken_by_others = state
            .fleet
            .shared_taken(&gpu_ref, &names)
            .await
            .unwrap_or_default();
        gpus.push(GroupGpu {
            gpu: gpu_ref,
            total: gpu.total,
            held_outside: gpu.held_outside,
            taken_by_others,
        });
    }
    let verdict = judge(&members, &gpus);
    Ok(Json(VerdictView {
        verdict: if verdict.is_refused() {
            "refused"
        } else {
            "fits"
        }
        .to_owned(),
        total_percent: verdict.total.as_percent_f64(),
        free_percent: verdict.free().as_percent_f64(),
        message: verdict.fits_message(),
        warning: verdict
            .warns()
            .then(|| placement::plan::FREE_ROW_WARNING.to_owned()),
        problems: verdict
            .problems
            .iter()
            .map(|p| ProblemView {
                message: p.message(),
                member: p.member().map(str::to_owned),
            })
            .collect(),
    }))
}

#[cfg(test)]
mod tests;
