//! Workers (seed 000): create, list, read and delete, each shown as the caller's role may see it.

use super::{page, ApiJson};
use crate::auth::Actor;
use crate::error::ApiError;
use crate::fleet::authority::Sight;
use crate::fleet::WorkerView;
use crate::input::NewWorker;
use crate::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::Json;
use placement::RequestedResources;
use serde::Deserialize;
use std::collections::BTreeMap;

/// `POST /api/workers`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewWorkerBody {
    /// A unique name.
    pub name: String,
    /// What it needs (seed 000).
    pub requested_resources: RequestedResources,
    /// The command to run.
    #[serde(default)]
    pub command: Option<String>,
    /// Environment variables for it.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

impl NewWorkerBody {
    /// The worker as the fleet takes it: its name, settings and request read once.
    pub fn parse(self) -> Result<NewWorker, ApiError> {
        NewWorker::parse(self.name, self.requested_resources, self.command, self.env)
    }
}

pub(super) async fn create_worker(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(new): ApiJson<NewWorkerBody>,
) -> Result<(StatusCode, Json<WorkerView>), ApiError> {
    let new = new.parse()?;
    Ok((
        StatusCode::CREATED,
        Json(state.fleet.create_worker(new, &actor).await?),
    ))
}

/// `GET /api/workers`' query: a page, and the workers on one machine, in one state, of one model.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WorkersQuery {
    limit: Option<String>,
    cursor: Option<String>,
    machine: Option<String>,
    state: Option<String>,
    model: Option<String>,
}

pub(super) async fn list_workers(
    State(state): State<AppState>,
    Actor(actor): Actor,
    uri: Uri,
    q: Result<Query<WorkersQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = page::query(q)?;
    let sight = Sight::of(&actor);
    let workers: Vec<WorkerView> = state
        .fleet
        .workers()
        .into_iter()
        .filter(|w| {
            page::matches(q.machine.as_deref(), w.machine.as_deref())
                && page::matches(q.state.as_deref(), Some(&w.state))
                && page::matches(q.model.as_deref(), w.model.as_deref())
        })
        .map(|w| state.fleet.shown(w, sight))
        .collect();
    let asked = page::PageQuery {
        limit: q.limit,
        cursor: q.cursor,
    };
    page::page(workers, |w| w.name.clone(), &asked, &uri)
}

pub(super) async fn get_worker(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(name): Path<String>,
) -> Result<Json<WorkerView>, ApiError> {
    let worker = state.fleet.worker(&name)?;
    Ok(Json(state.fleet.shown(worker, Sight::of(&actor))))
}

/// `?revision=N`: delete only if the worker is still at revision N.
#[derive(Debug, Deserialize)]
pub(super) struct RevisionQuery {
    revision: Option<i64>,
}

pub(super) async fn delete_worker(
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
