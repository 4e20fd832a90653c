//! Repacking: the plan that frees GPUs with the fewest restarts, and carrying it out one move at a time.

use super::ApiJson;
use crate::auth::Actor;
use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

/// `?free=N`: how many GPUs to free; the most it can when not said.
#[derive(Debug, Deserialize)]
pub(super) struct RepackQuery {
    free: Option<String>,
}

/// `POST /api/repack`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RepackRequest {
    /// How many GPUs to free; the most it can when not said.
    #[serde(default)]
    free: Option<usize>,
    /// The moves the operator was shown: refused (409) when the plan is no longer these.
    #[serde(default)]
    expect: Option<Vec<placement::Move>>,
}

fn repack_goal(free: Option<usize>) -> Result<placement::repack::Goal, ApiError> {
    placement::repack::Goal::from_free(free).map_err(|e| ApiError::Unprocessable(e.to_string()))
}

/// `GET /api/repack?free=N`: the plan that frees N GPUs (the most it can when not said) with the fewest
/// restarts, and the order it would be carried out in. Changes nothing.
pub(super) async fn repack_plan(
    State(state): State<AppState>,
    Query(query): Query<RepackQuery>,
) -> Result<Json<placement::RepackPlan>, ApiError> {
    let free = query
        .free
        .map(|f| {
            f.parse::<usize>().map_err(|_| {
                ApiError::BadRequest(format!(
                    "free must be a whole number of GPUs, such as ?free=1, not {f:?}"
                ))
            })
        })
        .transpose()?;
    Ok(Json(state.fleet.repack_plan(repack_goal(free)?).await?))
}

/// `POST /api/repack`: plans the repack again and starts carrying it out, one move at a time; 202.
pub(super) async fn start_repack(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(request): ApiJson<RepackRequest>,
) -> Result<(StatusCode, Json<app::views::RepackRun>), ApiError> {
    let goal = repack_goal(request.free)?;
    let run = state
        .fleet
        .start_repack(goal, request.expect, &actor.name)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(run)))
}

/// `GET /api/repack/run`: the repack being carried out, or the last one.
pub(super) async fn repack_run(
    State(state): State<AppState>,
) -> Result<Json<app::views::RepackRun>, ApiError> {
    state.fleet.repack_run().map(Json).ok_or_else(|| {
        ApiError::NotFound("no repack has been carried out since the server started".to_owned())
    })
}

/// `POST /api/repack/stop`: the repack stops before its next move.
pub(super) async fn stop_repack(
    State(state): State<AppState>,
    Actor(actor): Actor,
) -> Result<Json<app::views::RepackRun>, ApiError> {
    state.fleet.stop_repack(&actor.name).await.map(Json)
}
