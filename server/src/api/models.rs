//! The model catalog: the models one can deploy, and adding one.

use super::ApiJson;
use crate::auth::Actor;
use crate::catalog::CatalogModel;
use crate::error::ApiError;
use crate::fleet::authority::Sight;
use crate::input::NewModel;
use crate::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

pub(super) async fn list_models(
    State(state): State<AppState>,
    Actor(actor): Actor,
) -> Result<Json<Vec<CatalogModel>>, ApiError> {
    Ok(Json(state.fleet.models_shown(Sight::of(&actor))))
}

pub(super) async fn add_model(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(model): ApiJson<CatalogModel>,
) -> Result<(StatusCode, Json<CatalogModel>), ApiError> {
    // The recipe's JSON is the catalog's own, as `GET /api/models` answers it.
    let model = NewModel::parse(model)?;
    Ok((
        StatusCode::CREATED,
        Json(state.fleet.add_model(model, &actor.name).await?),
    ))
}
