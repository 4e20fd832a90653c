//! The REST API for scripts: JSON in, JSON out, errors as `{"error": "..."}` with the right status.

use crate::deployments::{ServingChange, ServingUpdate};
use crate::error::ApiError;
use crate::fleet::{MachineView, NewWorker, WorkerView};
use crate::groups::{Deploy, GroupView, PlanChange, PlanUpdate};
use crate::inventory::demo::CatalogModel;
use crate::runtime::EngineView;
use crate::AppState;
use axum::extract::{FromRequest, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use placement::{judge, GpuRef, Grouping, PlanMember, UsageReport, Verdict};
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
        .route("/api/models", get(list_models).post(add_model))
        .route("/api/groups", get(list_groups))
        .route("/api/groups/{name}", get(get_group))
        .route("/api/groups/{name}/plan", put(change_plan))
        .route("/api/deployments", post(deploy))
        .route("/api/deployments/{model}", delete(remove_deployment))
        .route("/api/deployments/{model}/serving", put(change_serving))
        .route("/api/engines", get(list_engines))
        .route("/api/engines/{id}", get(get_engine))
        .route("/api/engines/{id}/logs", get(engine_logs))
        .route("/api/engines/{id}/restart", post(restart_engine))
        .route("/api/events", get(events))
        .route("/api/usage", get(usage))
        .route("/api/usage.csv", get(usage_csv))
}

/// `?from=…&to=…&by=…`: a period in RFC 3339 (the last 24 hours unless said) and what to add up by.
#[derive(Debug, Deserialize)]
struct UsageQuery {
    from: Option<String>,
    to: Option<String>,
    by: Option<String>,
}

impl UsageQuery {
    /// The period in milliseconds since the epoch, and the grouping.
    fn read(&self) -> Result<(u64, u64, Grouping), ApiError> {
        let time = |name: &str, text: &Option<String>| -> Result<Option<u64>, ApiError> {
            text.as_deref()
                .map(|t| {
                    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                        .ok()
                        .and_then(|at| u64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok())
                        .ok_or_else(|| {
                            ApiError::BadRequest(format!(
                                "{name} must be a time such as 2026-12-01T00:00:00Z, not {t:?}"
                            ))
                        })
                })
                .transpose()
        };
        let to = time("to", &self.to)?.unwrap_or_else(crate::usage::now_ms);
        let from =
            time("from", &self.from)?.unwrap_or(to.saturating_sub(24 * placement::usage::HOUR_MS));
        if from >= to {
            return Err(ApiError::Unprocessable("from must be before to".to_owned()));
        }
        let by = match self.by.as_deref() {
            None => Grouping::default(),
            Some(name) => Grouping::parse(name).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "by must be machine, group, model or worker, not {name:?}"
                ))
            })?,
        };
        Ok((from, to, by))
    }
}

fn usage_query(
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(u64, u64, Grouping), ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    query.read()
}

/// `GET /api/usage`: GPU-hours, use and energy over a period, split among sharers by their share.
async fn usage(
    State(state): State<AppState>,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<UsageReport>, ApiError> {
    let (from, to, by) = usage_query(query)?;
    Ok(Json(state.fleet.usage(from, to, by).await?))
}

/// `GET /api/usage.csv`: the same report as CSV, the figures as the Usage page shows them.
async fn usage_csv(
    State(state): State<AppState>,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let (from, to, by) = usage_query(query)?;
    let report = state.fleet.usage(from, to, by).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!(
                    "attachment; filename=\"tessera-usage-by-{}.csv\"",
                    by.as_str()
                ),
            ),
        ],
        report.to_csv(),
    ))
}

async fn list_engines(State(state): State<AppState>) -> Json<Vec<EngineView>> {
    Json(state.fleet.runtime().engines())
}

async fn get_engine(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<EngineView>, ApiError> {
    state
        .fleet
        .runtime()
        .engine(&id)
        .map(Json)
        .ok_or_else(|| no_engine(&id))
}

/// `?lines=N`: how many of the last lines (100 unless said, at most 1000).
#[derive(Debug, Deserialize)]
struct LinesQuery {
    lines: Option<usize>,
}

/// An engine's last lines of output.
#[derive(Debug, Serialize, Deserialize)]
pub struct EngineLogs {
    /// The engine's id.
    pub engine: String,
    /// Oldest first.
    pub lines: Vec<String>,
}

async fn engine_logs(
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<LinesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EngineLogs>, ApiError> {
    let Query(query) = query.map_err(|_| {
        ApiError::BadRequest("lines must be a whole number, such as ?lines=50".to_owned())
    })?;
    let lines = query.lines.unwrap_or(100).min(1000);
    let read = state
        .fleet
        .runtime()
        .logs(&id, lines)
        .ok_or_else(|| no_engine(&id))?;
    Ok(Json(EngineLogs {
        engine: id,
        lines: read.map_err(ApiError::internal)?,
    }))
}

/// `POST /api/engines/{id}/restart`: stops the engine and starts it again as it is specified now, with a
/// fresh count of failures; 202, the restart follows the changes before it.
async fn restart_engine(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<EngineView>), ApiError> {
    let runtime = state.fleet.runtime();
    let engine = runtime.engine(&id).ok_or_else(|| no_engine(&id))?;
    if engine.host == crate::runtime::spec::Host::Remote {
        return Err(ApiError::Conflict(format!(
            "{} runs on {}, where Tessera has no agent: it cannot be restarted from here",
            engine.unit, engine.machine
        )));
    }
    runtime.submit(crate::runtime::Change::Restart(engine.unit.clone()));
    Ok((StatusCode::ACCEPTED, Json(engine)))
}

fn no_engine(id: &str) -> ApiError {
    ApiError::NotFound(format!(
        "there is no engine {id}; GET /api/engines lists them"
    ))
}

/// `GET /api/events`: engine states and plan-change steps as server-sent events, each a JSON object with
/// its `kind`, until the server stops.
async fn events(
    State(state): State<AppState>,
) -> axum::response::Sse<
    impl futures::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>,
> {
    use futures::StreamExt;
    let stream = state.fleet.runtime().events().map(|event| {
        Ok(axum::response::sse::Event::default()
            .json_data(&event)
            .unwrap_or_else(|_| {
                axum::response::sse::Event::default().comment("unserializable event")
            }))
    });
    axum::response::Sse::new(stream).keep_alive(axum::response::sse::KeepAlive::default())
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

async fn list_workers(State(state): State<AppState>) -> Json<Vec<WorkerView>> {
    Json(state.fleet.workers())
}

async fn get_worker(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<WorkerView>, ApiError> {
    Ok(Json(state.fleet.worker(&name)?))
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
) -> Result<impl IntoResponse, ApiError> {
    let json = state.fleet.machine_workers(&name)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], json))
}

async fn list_models(State(state): State<AppState>) -> Result<Json<Vec<CatalogModel>>, ApiError> {
    Ok(Json(state.fleet.models().await?))
}

async fn add_model(
    State(state): State<AppState>,
    ApiJson(model): ApiJson<CatalogModel>,
) -> Result<(StatusCode, Json<CatalogModel>), ApiError> {
    Ok((
        StatusCode::CREATED,
        Json(state.fleet.add_model(model).await?),
    ))
}

async fn list_groups(State(state): State<AppState>) -> Result<Json<Vec<GroupView>>, ApiError> {
    Ok(Json(state.fleet.groups().await?))
}

async fn get_group(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<GroupView>, ApiError> {
    Ok(Json(state.fleet.group(&name).await?))
}

async fn change_plan(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiJson(update): ApiJson<PlanUpdate>,
) -> Result<Json<PlanChange>, ApiError> {
    Ok(Json(state.fleet.change_plan(&name, update).await?))
}

async fn deploy(
    State(state): State<AppState>,
    ApiJson(deploy): ApiJson<Deploy>,
) -> Result<(StatusCode, Json<PlanChange>), ApiError> {
    Ok((StatusCode::CREATED, Json(state.fleet.deploy(deploy).await?)))
}

/// `?revision=N`: required, the revision the deployment was read at.
#[derive(Debug, Deserialize)]
struct RequiredRevision {
    revision: i64,
}

/// `DELETE /api/deployments/{model}?revision=N`: the model stops; a group's other members keep their
/// shares. 200 with what stops.
async fn remove_deployment(
    State(state): State<AppState>,
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
            .remove_deployment(&model, query.revision)
            .await?,
    ))
}

/// `PUT /api/deployments/{model}/serving`: the model's extra arguments and environment; it restarts alone.
async fn change_serving(
    State(state): State<AppState>,
    Path(model): Path<String>,
    ApiJson(update): ApiJson<ServingUpdate>,
) -> Result<Json<ServingChange>, ApiError> {
    Ok(Json(state.fleet.change_serving(&model, update).await?))
}

/// `POST /api/plans/validate`: a group's members with their shares in percent, and the GPUs it runs on.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanRequest {
    members: Vec<PlanMemberRequest>,
    /// GPUs as `machine:index`.
    #[serde(default)]
    gpus: Vec<String>,
    /// The group the plan is for, whose own memory on those GPUs does not count against it.
    #[serde(default)]
    group: Option<String>,
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

/// A GPU named as `machine:index`.
pub(crate) fn parse_gpu_ref(id: &str) -> Result<GpuRef, ApiError> {
    id.split_once(':')
        .and_then(|(m, i)| Some(GpuRef::new(m, i.parse().ok()?)))
        .ok_or_else(|| {
            ApiError::Unprocessable(format!(
                "GPU {id:?}: name it as machine:index, such as majin:0"
            ))
        })
}

/// The verdict as scripts read it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerdictView {
    /// `fits` or `refused`.
    pub verdict: String,
    /// The sum of the shares, percent.
    pub total_percent: f64,
    /// What is left of one GPU, percent.
    pub free_percent: f64,
    /// The line under the bar when it fits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Free row's warning over 90 %.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Why it is refused, each naming its member where there is one.
    pub problems: Vec<ProblemView>,
}

/// One reason a plan is refused.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProblemView {
    /// The seed's sentence.
    pub message: String,
    /// The member it is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
}

impl From<&Verdict> for VerdictView {
    fn from(verdict: &Verdict) -> VerdictView {
        VerdictView {
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
        }
    }
}

async fn validate_plan(
    State(state): State<AppState>,
    ApiJson(plan): ApiJson<PlanRequest>,
) -> Result<Json<VerdictView>, ApiError> {
    let mut members = Vec::with_capacity(plan.members.len());
    for m in &plan.members {
        let share = m
            .share
            .map(|p| crate::groups::percent(p, &m.name))
            .transpose()?;
        members.push(PlanMember {
            name: m.name.clone(),
            share,
            locked: m.locked,
        });
    }
    let mut gpus = Vec::with_capacity(plan.gpus.len());
    for id in &plan.gpus {
        gpus.push(
            state
                .fleet
                .group_gpu(&parse_gpu_ref(id)?, plan.group.as_deref())
                .await?,
        );
    }
    Ok(Json(VerdictView::from(&judge(&members, &gpus))))
}

#[cfg(test)]
mod tests;
