//! The REST API for scripts: JSON in, JSON out, errors as `{"error": "..."}` with the right status.

use crate::auth::Actor;
use crate::error::ApiError;
use crate::fleet::authority::{redact_args, redact_line, Sight};
use crate::fleet::deployments::ServingChange;
use crate::fleet::groups::{DeployCommand, GroupView, PlanChange, PlanCommand, Serving, Sharing};
use crate::fleet::{MachineView, NewWorker, WorkerView};
use crate::inventory::demo::CatalogModel;
use crate::runtime::EngineView;
use crate::AppState;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Path, Query, State};
use axum::http::Method;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::{Json, Router};
use placement::{judge, BasisPoints, Demand, GpuRef, Grouping, PlanMember, UsageReport, Verdict};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// JSON whose rejection is an [`ApiError`], so that a malformed body gets our error shape.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// One route of the REST API. The router is built from [`table`], and a test holds the OpenAPI document
/// (`server/openapi.json`) to the same list, so that the two cannot drift apart.
pub struct ApiRoute {
    /// The path, in axum's `{param}` form, as OpenAPI writes it too.
    pub path: &'static str,
    /// The method.
    pub method: Method,
    handler: MethodRouter<AppState>,
}

fn route(path: &'static str, method: Method, handler: MethodRouter<AppState>) -> ApiRoute {
    ApiRoute {
        path,
        method,
        handler,
    }
}

/// Every route of the REST API.
pub fn table() -> Vec<ApiRoute> {
    use Method as M;
    vec![
        route("/api/health", M::GET, get(crate::health)),
        route("/api/openapi.json", M::GET, get(openapi)),
        route("/metrics", M::GET, get(crate::metrics::metrics)),
        route("/api/me", M::GET, get(accounts::me)),
        route("/api/users", M::GET, get(accounts::list_users)),
        route("/api/users", M::POST, post(accounts::create_user)),
        route(
            "/api/users/{name}",
            M::DELETE,
            delete(accounts::delete_user),
        ),
        route("/api/tokens", M::GET, get(accounts::list_tokens)),
        route("/api/tokens", M::POST, post(accounts::create_token)),
        route(
            "/api/tokens/{id}",
            M::DELETE,
            delete(accounts::revoke_token),
        ),
        route("/api/audit", M::GET, get(accounts::audit)),
        route("/api/workers", M::POST, post(create_worker)),
        route("/api/workers", M::GET, get(list_workers)),
        route("/api/workers/{name}", M::GET, get(get_worker)),
        route("/api/workers/{name}", M::DELETE, delete(delete_worker)),
        route("/api/machines", M::GET, get(list_machines)),
        route("/api/machines/{name}", M::GET, get(get_machine)),
        route("/api/machines/{name}/workers", M::GET, get(machine_workers)),
        route(
            "/api/machines/{name}/gpus/{index}/sharing",
            M::PUT,
            put(set_sharing),
        ),
        route("/api/plans/validate", M::POST, post(validate_plan)),
        route("/api/models", M::GET, get(list_models)),
        route("/api/models", M::POST, post(add_model)),
        route("/api/groups", M::GET, get(list_groups)),
        route("/api/groups/{name}", M::GET, get(get_group)),
        route("/api/groups/{name}/plan", M::PUT, put(change_plan)),
        route("/api/deployments", M::POST, post(deploy)),
        route(
            "/api/deployments/{model}",
            M::DELETE,
            delete(remove_deployment),
        ),
        route(
            "/api/deployments/{model}/serving",
            M::PUT,
            put(change_serving),
        ),
        route("/api/engines", M::GET, get(list_engines)),
        route("/api/engines/{id}", M::GET, get(get_engine)),
        route("/api/engines/{id}/logs", M::GET, get(engine_logs)),
        route("/api/engines/{id}/restart", M::POST, post(restart_engine)),
        route("/api/events", M::GET, get(events)),
        route("/api/usage", M::GET, get(usage)),
        route("/api/usage.csv", M::GET, get(usage_csv)),
        route("/api/usage/requests.csv", M::GET, get(requests_csv)),
        route("/api/playground", M::POST, post(crate::gateway::playground)),
        route("/api/repack", M::GET, get(repack_plan)),
        route("/api/repack", M::POST, post(start_repack)),
        route("/api/repack/run", M::GET, get(repack_run)),
        route("/api/repack/stop", M::POST, post(stop_repack)),
    ]
}

/// The REST API's router.
pub fn routes() -> Router<AppState> {
    table()
        .into_iter()
        .fold(Router::new(), |router, r| router.route(r.path, r.handler))
}

/// The OpenAPI document of the REST API.
pub const OPENAPI: &str = include_str!("../../openapi.json");

/// `GET /api/openapi.json`.
async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
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
        let to = time("to", &self.to)?.unwrap_or_else(crate::fleet::usage::now_ms);
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

/// `GET /api/usage/requests.csv`: the gateway's requests over the period, per model and API token.
async fn requests_csv(
    State(state): State<AppState>,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let (from, to, _) = usage_query(query)?;
    let requests = state.fleet.calls().report(&state.pool, from, to).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"tessera-requests.csv\"",
            ),
        ],
        placement::usage::requests_csv(&requests),
    ))
}

/// An engine as `sight` shows it: the values of secret flags in its command line redacted.
fn shown_engine(mut engine: EngineView, sight: Sight) -> EngineView {
    if sight == Sight::Redacted {
        engine.command = engine.command.map(|c| redact_args(&c));
    }
    engine
}

async fn list_engines(State(state): State<AppState>, Actor(actor): Actor) -> Json<Vec<EngineView>> {
    let sight = Sight::of(&actor);
    Json(
        state
            .fleet
            .runtime()
            .engines()
            .into_iter()
            .map(|e| shown_engine(e, sight))
            .collect(),
    )
}

async fn get_engine(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(id): Path<String>,
) -> Result<Json<EngineView>, ApiError> {
    state
        .fleet
        .runtime()
        .engine(&id)
        .map(|e| Json(shown_engine(e, Sight::of(&actor))))
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
    Actor(actor): Actor,
    Path(id): Path<String>,
    query: Result<Query<LinesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EngineLogs>, ApiError> {
    let Query(query) = query.map_err(|_| {
        ApiError::BadRequest("lines must be a whole number, such as ?lines=50".to_owned())
    })?;
    let lines = query.lines.unwrap_or(100).min(1000);
    let runtime = state.fleet.runtime();
    let engine = runtime.engine(&id).ok_or_else(|| no_engine(&id))?;
    let read = runtime
        .logs(&id, lines)
        .await
        .ok_or_else(|| no_engine(&id))?;
    let mut lines = read.map_err(ApiError::internal)?;
    // An engine may print its settings: what it was given in secret stays so for all but admins.
    if Sight::of(&actor) == Sight::Redacted {
        let secrets = state.fleet.engine_secrets(&engine);
        for line in &mut lines {
            *line = redact_line(line, &secrets);
        }
    }
    Ok(Json(EngineLogs { engine: id, lines }))
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

/// `?free=N`: how many GPUs to free; the most it can when not said.
#[derive(Debug, Deserialize)]
struct RepackQuery {
    free: Option<String>,
}

/// `POST /api/repack`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RepackRequest {
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
async fn repack_plan(
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
async fn start_repack(
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
async fn repack_run(
    State(state): State<AppState>,
) -> Result<Json<app::views::RepackRun>, ApiError> {
    state.fleet.repack_run().map(Json).ok_or_else(|| {
        ApiError::NotFound("no repack has been carried out since the server started".to_owned())
    })
}

/// `POST /api/repack/stop`: the repack stops before its next move.
async fn stop_repack(
    State(state): State<AppState>,
    Actor(actor): Actor,
) -> Result<Json<app::views::RepackRun>, ApiError> {
    state.fleet.stop_repack(&actor.name).await.map(Json)
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
    Actor(actor): Actor,
    ApiJson(new): ApiJson<NewWorker>,
) -> Result<(StatusCode, Json<WorkerView>), ApiError> {
    Ok((
        StatusCode::CREATED,
        Json(state.fleet.create_worker(new, &actor).await?),
    ))
}

async fn list_workers(State(state): State<AppState>, Actor(actor): Actor) -> Json<Vec<WorkerView>> {
    let sight = Sight::of(&actor);
    Json(
        state
            .fleet
            .workers()
            .into_iter()
            .map(|w| state.fleet.shown(w, sight))
            .collect(),
    )
}

async fn get_worker(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(name): Path<String>,
) -> Result<Json<WorkerView>, ApiError> {
    let worker = state.fleet.worker(&name)?;
    Ok(Json(state.fleet.shown(worker, Sight::of(&actor))))
}

/// `?revision=N`: delete only if the worker is still at revision N.
#[derive(Debug, Deserialize)]
struct RevisionQuery {
    revision: Option<i64>,
}

async fn delete_worker(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(name): Path<String>,
    query: Result<Query<RevisionQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let Query(query) = query.map_err(|_| {
        ApiError::BadRequest("revision must be a whole number, such as ?revision=2".to_owned())
    })?;
    state
        .fleet
        .delete_worker(&name, query.revision, &actor.name)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_machines(State(state): State<AppState>) -> Json<Vec<MachineView>> {
    Json(state.fleet.machines())
}

async fn get_machine(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<MachineView>, ApiError> {
    Ok(Json(state.fleet.machine(&name)?))
}

/// `{"mode": "time-slicing" | "mps" | "mig", "compute_percent": N, "instances": ["3g.40gb", …]}`: how a
/// GPU is to be shared; under MIG, the profiles it is cut into.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SharingUpdate {
    mode: String,
    compute_percent: Option<i64>,
    instances: Option<Vec<String>>,
}

/// `PUT /api/machines/{name}/gpus/{index}/sharing`: shares the GPU as asked; its sharers restart, each
/// stopped before it starts again. 200 with what restarts.
async fn set_sharing(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path((name, index)): Path<(String, String)>,
    ApiJson(update): ApiJson<SharingUpdate>,
) -> Result<Json<app::views::SharingChange>, ApiError> {
    let index = index.parse().map_err(|_| {
        ApiError::BadRequest(format!(
            "a GPU is named by its index on the machine, such as /api/machines/{name}/gpus/0/sharing, not {index:?}"
        ))
    })?;
    let gpu = GpuRef::new(name, index);
    let sharing = placement::sharing::GpuSharing::parse(&update.mode, update.compute_percent)
        .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
    Ok(Json(
        state
            .fleet
            .set_sharing(gpu, sharing, update.instances, &actor.name)
            .await?,
    ))
}

async fn machine_workers(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let json = state.fleet.machine_workers(&name, Sight::of(&actor))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], json))
}

async fn list_models(
    State(state): State<AppState>,
    Actor(actor): Actor,
) -> Result<Json<Vec<CatalogModel>>, ApiError> {
    Ok(Json(state.fleet.models_shown(Sight::of(&actor))))
}

async fn add_model(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(model): ApiJson<CatalogModel>,
) -> Result<(StatusCode, Json<CatalogModel>), ApiError> {
    Ok((
        StatusCode::CREATED,
        Json(state.fleet.add_model(model, &actor.name).await?),
    ))
}

async fn list_groups(State(state): State<AppState>) -> Result<Json<Vec<GroupView>>, ApiError> {
    Ok(Json(state.fleet.groups()))
}

async fn get_group(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<GroupView>, ApiError> {
    Ok(Json(state.fleet.group(&name)?))
}

async fn change_plan(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(name): Path<String>,
    ApiJson(update): ApiJson<PlanUpdate>,
) -> Result<Json<PlanChange>, ApiError> {
    let update = update.parse()?;
    Ok(Json(
        state.fleet.change_plan(&name, update, &actor.name).await?,
    ))
}

async fn deploy(
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
struct RequiredRevision {
    revision: i64,
}

/// `DELETE /api/deployments/{model}?revision=N`: the model stops; a group's other members keep their
/// shares. 200 with what stops.
async fn remove_deployment(
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
async fn change_serving(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(model): Path<String>,
    ApiJson(update): ApiJson<ServingUpdate>,
) -> Result<Json<ServingChange>, ApiError> {
    Ok(Json(
        state
            .fleet
            .change_serving(&model, update.revision, update.serving(), &actor)
            .await?,
    ))
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
    /// Pinned (the default) or on demand: on-demand members take turns beside the pinned ones.
    #[serde(default)]
    demand: Demand,
}

// Errors as the REST API answers them: the status for each kind, `{"error": "..."}` as the body (with the
// whole verdict beside a refused plan), and internal errors logged, never sent.

impl ApiError {
    /// The HTTP status this error answers with.
    pub fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unprocessable(_) | ApiError::Refused { .. } => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::TooLarge(format!(
                "the request body is larger than the {} KiB a request may send",
                crate::security::MAX_BODY_BYTES / 1024
            ));
        }
        match rejection {
            // Valid JSON of the wrong shape: say which field.
            JsonRejection::JsonDataError(e) => {
                ApiError::Unprocessable(format!("the request body does not fit: {}", e.body_text()))
            }
            JsonRejection::JsonSyntaxError(e) => ApiError::BadRequest(format!(
                "the request body is not valid JSON: {}",
                e.body_text()
            )),
            JsonRejection::MissingJsonContentType(_) => ApiError::BadRequest(
                "send the body as JSON with Content-Type: application/json".to_owned(),
            ),
            other => ApiError::BadRequest(other.body_text()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Refused { message, verdict } = &self {
            let body = serde_json::json!({ "error": message, "verdict": VerdictView::from(verdict.as_ref()) });
            return (self.status_code(), Json(body)).into_response();
        }
        let message = match &self {
            ApiError::Internal(detail) => {
                tracing::error!("{detail}");
                "something went wrong on the server; it has been logged".to_owned()
            }
            other => other.to_string(),
        };
        (
            self.status_code(),
            Json(serde_json::json!({ "error": message })),
        )
            .into_response()
    }
}

/// A GPU named `machine:index`.
fn parse_gpu_ref(id: &str) -> Result<GpuRef, ApiError> {
    id.parse()
        .map_err(|e: placement::GpuRefError| ApiError::Unprocessable(e.to_string()))
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
}

/// `PUT /api/groups/{name}/plan`: every member's share, against the revision it was read at.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanUpdate {
    /// The revision the plan was read at.
    pub revision: i64,
    /// Each member's share, percent. A member left out has no explicit share, which the verdict refuses.
    pub shares: BTreeMap<String, f64>,
    /// Members whose demand changes (`{"mode": "pinned"}` or `{"mode": "on_demand", "keep_alive": 300}`);
    /// the others keep theirs.
    #[serde(default)]
    pub demand: BTreeMap<String, Demand>,
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

/// A share in percent from a request, read once into basis points.
fn percent(share: f64, whose: &str) -> Result<BasisPoints, ApiError> {
    BasisPoints::from_percent(share).map_err(|e| {
        ApiError::Unprocessable(format!(
            "the share of {whose} {e}; give a percentage such as 33.33"
        ))
    })
}

/// Shares in percent from a request, read once into basis points.
fn percents(shares: BTreeMap<String, f64>) -> Result<BTreeMap<String, BasisPoints>, ApiError> {
    shares
        .into_iter()
        .map(|(member, p)| {
            let share = percent(p, &member)?;
            Ok((member, share))
        })
        .collect()
}

impl Deploy {
    /// The deploy as the fleet takes it: GPUs, shares and sharing read once.
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
            )?,
            model: self.model,
            gpus,
            serving: Serving {
                args: self.args,
                env: self.env,
            },
        })
    }
}

impl PlanUpdate {
    /// The plan change as the fleet takes it, its shares read once.
    pub fn parse(self) -> Result<PlanCommand, ApiError> {
        Ok(PlanCommand {
            revision: self.revision,
            shares: percents(self.shares)?,
            demand: self.demand,
        })
    }
}

impl ServingUpdate {
    /// The serving configuration it sets.
    pub fn serving(self) -> Serving {
        Serving {
            args: self.args,
            env: self.env,
        }
    }
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
    /// With on-demand members: `On-demand models take turns in the 30% the pinned ones leave.`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<String>,
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
            turns: verdict.turns_message(),
        }
    }
}

async fn validate_plan(
    State(state): State<AppState>,
    ApiJson(plan): ApiJson<PlanRequest>,
) -> Result<Json<VerdictView>, ApiError> {
    let mut members = Vec::with_capacity(plan.members.len());
    for m in &plan.members {
        let share = m.share.map(|p| percent(p, &m.name)).transpose()?;
        members.push(PlanMember {
            name: m.name.clone(),
            share,
            locked: m.locked,
            demand: m.demand,
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

mod accounts;

#[cfg(test)]
mod tests;
