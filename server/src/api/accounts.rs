//! The REST API's accounts, API tokens and audit log routes.

use crate::accounts;
use crate::api::ApiJson;
use crate::audit::{self, AuditEntry, AuditFilter};
use crate::auth::Actor;
use crate::error::ApiError;
use crate::input::{NewToken, NewUser};
use crate::AppState;
use app::auth::{Caller, Role};
use app::views::{Account, ApiToken, NewApiToken, TokenLimits, TokenScope};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;

/// `POST /api/users`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewUserBody {
    /// Letters, digits, `.`, `-`, `_`, at most 63.
    pub name: String,
    /// `admin`, `operator` or `viewer`.
    pub role: Role,
    /// At least 12 characters.
    pub password: String,
}

/// `POST /api/tokens`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTokenBody {
    /// What it is for, such as `ci`.
    pub name: String,
    /// Whose role it acts with; the caller's own account when absent.
    #[serde(default)]
    pub user: Option<String>,
    /// `api` (the default: every route its owner's role allows) or `inference` (only the gateway, `/v1`).
    #[serde(default)]
    pub scope: TokenScope,
    /// For an inference token, the models it may call; every model when absent.
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// When it stops working, RFC 3339 (`2027-01-31T00:00:00Z`); never when absent.
    #[serde(default)]
    pub expires_at: Option<String>,
}

/// `GET /api/me`: who the caller is, with which role.
pub async fn me(Actor(caller): Actor) -> Json<Caller> {
    Json(caller)
}

/// `GET /api/users`.
/// A page of a list with no filters of its own: users, tokens.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlainListQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

impl PlainListQuery {
    fn page(self) -> super::page::PageQuery {
        super::page::PageQuery {
            limit: self.limit,
            cursor: self.cursor,
        }
    }
}

pub async fn list_users(
    State(state): State<AppState>,
    uri: axum::http::Uri,
    q: Result<axum::extract::Query<PlainListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::response::Response, ApiError> {
    let asked = super::page::query(q)?.page();
    let users = accounts::users(&state.pool).await?;
    super::page::page(users, |u| u.name.clone(), &asked, &uri)
}

/// `POST /api/users`.
pub async fn create_user(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(new): ApiJson<NewUserBody>,
) -> Result<(StatusCode, Json<Account>), ApiError> {
    let new = NewUser::parse(new.name, new.role, new.password)?;
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
pub async fn list_tokens(
    State(state): State<AppState>,
    uri: axum::http::Uri,
    q: Result<axum::extract::Query<PlainListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::response::Response, ApiError> {
    let asked = super::page::query(q)?.page();
    let tokens = accounts::tokens(&state.pool).await?;
    super::page::page(tokens, |t| t.id.to_string(), &asked, &uri)
}

/// `POST /api/tokens`: the secret is in this answer and nowhere else.
pub async fn create_token(
    State(state): State<AppState>,
    Actor(actor): Actor,
    ApiJson(new): ApiJson<NewTokenBody>,
) -> Result<(StatusCode, Json<NewApiToken>), ApiError> {
    let limits = TokenLimits {
        scope: new.scope,
        models: new.models,
        expires_at: new.expires_at,
    };
    let token = NewToken::parse(new.name, limits)?;
    let user = new.user.unwrap_or_else(|| actor.name.clone());
    let issued = accounts::create_token(&state.pool, &user, &token, &actor.name).await?;
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

/// `GET /api/check` (admins; `tessera check`): what the fleet keeps in memory held against the whole
/// rebuild from the database, with what differs. Writes wait while it reads.
pub(super) async fn check(
    State(state): State<AppState>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let differences = state.fleet.check().await?;
    Ok(Json(serde_json::json!({
        "consistent": differences.is_empty(),
        "differences": differences,
    })))
}
