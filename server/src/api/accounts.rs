//! The REST API's accounts, API tokens and audit log routes.

use crate::accounts::{self, NewToken, NewUser};
use crate::api::ApiJson;
use crate::audit::{self, AuditEntry, AuditFilter};
use crate::auth::Actor;
use crate::error::ApiError;
use crate::AppState;
use app::auth::Caller;
use app::views::{Account, ApiToken, NewApiToken};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;

/// `GET /api/me`: who the caller is, with which role.
pub async fn me(Actor(caller): Actor) -> Json<Caller> {
    Json(caller)
}

/// `GET /api/users`.
pub async fn list_users(State(state): State<AppState>) -> Result<Json<Vec<Account>>, ApiError> {
    Ok(Json(accounts::users(&state.pool).await?))
}

/// `POST /api/users`.
pub async fn create_user(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(new): ApiJson<NewUser>,
) -> Result<(StatusCode, Json<Account>), ApiError> {
    let user = accounts::create_user(&state.pool, &new, &actor.name).await?;
    Ok((StatusCode::CREATED, Json(user)))
}

/// `DELETE /api/users/{name}`.
pub async fn delete_user(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    accounts::delete_user(&state.pool, &name, &actor.name).await?;
    state.tokens.forget();
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/tokens`.
pub async fn list_tokens(State(state): State<AppState>) -> Result<Json<Vec<ApiToken>>, ApiError> {
    Ok(Json(accounts::tokens(&state.pool).await?))
}

/// `POST /api/tokens`: the secret is in this answer and nowhere else.
pub async fn create_token(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(new): ApiJson<NewToken>,
) -> Result<(StatusCode, Json<NewApiToken>), ApiError> {
    let limits = new.limits()?;
    let user = new.user.unwrap_or_else(|| actor.name.clone());
    let issued =
        accounts::create_token(&state.pool, &user, &new.name, &limits, &actor.name).await?;
    Ok((StatusCode::CREATED, Json(issued)))
}

/// `DELETE /api/tokens/{id}`.
pub async fn revoke_token(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(id): Path<String>,
) -> Result<Json<ApiToken>, ApiError> {
    let id: i64 = id.parse().map_err(|_| {
        ApiError::BadRequest(format!(
            "a token's id is a whole number (GET /api/tokens lists them), not {id:?}"
        ))
    })?;
    let revoked = accounts::revoke_token(&state.pool, id, &actor.name).await?;
    state.tokens.forget();
    Ok(Json(revoked))
}

/// `GET /api/audit?actor=&action=&target=&limit=`: newest first.
pub async fn audit(
    State(state): State<AppState>,
    query: Result<Query<AuditFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<AuditEntry>>, ApiError> {
    let Query(filter) = query.map_err(|e| {
        ApiError::BadRequest(format!(
            "{}; filter by actor, action, target and limit (a whole number)",
            e.body_text()
        ))
    })?;
    Ok(Json(audit::entries(&state.pool, &filter).await?))
}
