//! Machines and their GPUs: what each offers and holds, the workers on it, and how a GPU is shared
//! (time-slicing, MPS or MIG instances).

use super::{page, ApiJson};
use crate::auth::Actor;
use crate::error::ApiError;
use crate::fleet::authority::Sight;
use crate::fleet::MachineView;
use crate::input::SharingCommand;
use crate::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use placement::GpuRef;
use serde::Deserialize;

/// `GET /api/machines`' query: a page, the machines whose name holds `q`, those reachable or not, and
/// those with a GPU of one model.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MachinesQuery {
    limit: Option<String>,
    cursor: Option<String>,
    q: Option<String>,
    state: Option<String>,
    gpu_model: Option<String>,
}

pub(super) async fn list_machines(
    State(state): State<AppState>,
    uri: Uri,
    q: Result<Query<MachinesQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = page::query(q)?;
    let wanted = match q.state.as_deref() {
        None => None,
        Some("reachable") => Some(true),
        Some("unreachable") => Some(false),
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "state is reachable or unreachable, not {other:?}"
            )))
        }
    };
    let machines: Vec<MachineView> = state
        .fleet
        .machines()
        .into_iter()
        .filter(|m| {
            q.q.as_deref().is_none_or(|part| m.name.contains(part))
                && wanted.is_none_or(|reachable| m.unreachable_since.is_none() == reachable)
                && q.gpu_model
                    .as_deref()
                    .is_none_or(|model| m.gpus.iter().any(|g| g.model == model))
        })
        .collect();
    let asked = page::PageQuery {
        limit: q.limit,
        cursor: q.cursor,
    };
    page::page(machines, |m| m.name.clone(), &asked, &uri)
}

pub(super) async fn get_machine(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<MachineView>, ApiError> {
    Ok(Json(state.fleet.machine(&name)?))
}

/// `{"mode": "time-slicing" | "mps" | "mig", "compute_percent": N, "instances": ["3g.40gb", …]}`: how a
/// GPU is to be shared; under MIG, the profiles it is cut into.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SharingUpdate {
    mode: String,
    compute_percent: Option<i64>,
    instances: Option<Vec<String>>,
}

/// `PUT /api/machines/{name}/gpus/{index}/sharing`: shares the GPU as asked; its sharers restart, each
/// stopped before it starts again. 200 with what restarts.
pub(super) async fn set_sharing(
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
    let command = SharingCommand::parse(
        GpuRef::new(name, index),
        &update.mode,
        update.compute_percent,
        update.instances,
    )?;
    Ok(Json(state.fleet.set_sharing(command, &actor.name).await?))
}

pub(super) async fn machine_workers(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(name): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    let json = state.fleet.machine_workers(&name, Sight::of(&actor))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], json))
}
