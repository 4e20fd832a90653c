//! The engines the runtime runs: each one's view, its last lines of output and a restart, plus the stream of
//! engine states and plan-change steps. Secrets in command lines and logs are redacted here for non-admins.

use super::page;
use crate::auth::Actor;
use crate::error::ApiError;
use crate::fleet::authority::{redact_args, redact_line, Sight};
use crate::runtime::EngineView;
use crate::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};

/// An engine as `sight` shows it: the values of secret flags in its command line redacted.
fn shown_engine(mut engine: EngineView, sight: Sight) -> EngineView {
    if sight == Sight::Redacted {
        engine.command = engine.command.map(|c| redact_args(&c));
    }
    engine
}

/// `GET /api/engines`' query: a page, and the engines on one machine, of one model or group, in one state.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EnginesQuery {
    limit: Option<String>,
    cursor: Option<String>,
    machine: Option<String>,
    model: Option<String>,
    group: Option<String>,
    state: Option<String>,
}

pub(super) async fn list_engines(
    State(state): State<AppState>,
    Actor(actor): Actor,
    uri: Uri,
    q: Result<Query<EnginesQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = page::query(q)?;
    let sight = Sight::of(&actor);
    let engines: Vec<EngineView> = state
        .fleet
        .runtime()
        .engines()
        .into_iter()
        .filter(|e| {
            let engine_state = serde_json::to_value(e.state).ok();
            page::matches(q.machine.as_deref(), Some(&e.machine))
                && page::matches(
                    q.model.as_deref(),
                    e.model.as_deref().or(e.worker.as_deref()),
                )
                && page::matches(q.group.as_deref(), e.group.as_deref())
                && page::matches(
                    q.state.as_deref(),
                    engine_state.as_ref().and_then(serde_json::Value::as_str),
                )
        })
        .map(|e| shown_engine(e, sight))
        .collect();
    let asked = page::PageQuery {
        limit: q.limit,
        cursor: q.cursor,
    };
    page::page(engines, |e| e.unit.clone(), &asked, &uri)
}

pub(super) async fn get_engine(
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
pub(super) struct LinesQuery {
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

pub(super) async fn engine_logs(
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
/// fresh count of failures; 202, the restart follows the changes before it. 409 for one no longer wanted
/// (its stop under way).
pub(super) async fn restart_engine(
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
    state.fleet.restart_engine(&engine.unit).await?;
    Ok((StatusCode::ACCEPTED, Json(engine)))
}

fn no_engine(id: &str) -> ApiError {
    ApiError::NotFound(format!(
        "there is no engine {id}; GET /api/engines lists them"
    ))
}

/// `GET /api/events`: engine states and plan-change steps as server-sent events, each a JSON object with
/// its `kind`, until the server stops.
pub(super) async fn events(
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
