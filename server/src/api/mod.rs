//! The REST API for scripts: JSON in, JSON out, errors as `{"error": "..."}` with the right status.
//!
//! This file holds the one route table, the JSON extractor and error mapping every resource shares, and the
//! OpenAPI document; each resource's handlers and request bodies live in the file named after it.

use crate::error::ApiError;
use crate::AppState;
use axum::extract::rejection::JsonRejection;
use axum::extract::FromRequest;
use axum::http::Method;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::{Json, Router};
use placement::BasisPoints;
use std::collections::BTreeMap;

mod accounts;
mod deployments;
mod engines;
mod groups;
mod machines;
mod models;
mod page;
mod repack;
mod usage;
mod workers;

pub use deployments::{Deploy, ServingUpdate};
pub use engines::EngineLogs;
pub use groups::{PlanUpdate, ProblemView, VerdictView};
pub use workers::NewWorkerBody;

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
        route("/api/check", M::GET, get(accounts::check)),
        route("/api/workers", M::POST, post(workers::create_worker)),
        route("/api/workers", M::GET, get(workers::list_workers)),
        route("/api/workers/{name}", M::GET, get(workers::get_worker)),
        route(
            "/api/workers/{name}",
            M::DELETE,
            delete(workers::delete_worker),
        ),
        route("/api/machines", M::GET, get(machines::list_machines)),
        route("/api/machines/{name}", M::GET, get(machines::get_machine)),
        route(
            "/api/machines/{name}/workers",
            M::GET,
            get(machines::machine_workers),
        ),
        route(
            "/api/machines/{name}/gpus/{index}/sharing",
            M::PUT,
            put(machines::set_sharing),
        ),
        route("/api/plans/validate", M::POST, post(groups::validate_plan)),
        route("/api/models", M::GET, get(models::list_models)),
        route("/api/models", M::POST, post(models::add_model)),
        route("/api/models/{name}", M::GET, get(models::get_model)),
        route(
            "/api/models/{name}/estimate",
            M::GET,
            get(models::estimate_model),
        ),
        route("/api/models/{name}/peaks", M::GET, get(models::model_peaks)),
        route("/api/groups", M::GET, get(groups::list_groups)),
        route("/api/groups/{name}", M::GET, get(groups::get_group)),
        route("/api/groups/{name}/plan", M::PUT, put(groups::change_plan)),
        route("/api/deployments", M::POST, post(deployments::deploy)),
        route(
            "/api/deployments/{model}",
            M::DELETE,
            delete(deployments::remove_deployment),
        ),
        route(
            "/api/deployments/{model}/serving",
            M::PUT,
            put(deployments::change_serving),
        ),
        route(
            "/api/deployments/{model}/replicas",
            M::PUT,
            put(deployments::change_replicas),
        ),
        route("/api/engines", M::GET, get(engines::list_engines)),
        route("/api/engines/{id}", M::GET, get(engines::get_engine)),
        route("/api/engines/{id}/logs", M::GET, get(engines::engine_logs)),
        route(
            "/api/engines/{id}/restart",
            M::POST,
            post(engines::restart_engine),
        ),
        route("/api/events", M::GET, get(engines::events)),
        route("/api/usage", M::GET, get(usage::usage)),
        route("/api/usage.csv", M::GET, get(usage::usage_csv)),
        route("/api/usage/requests.csv", M::GET, get(usage::requests_csv)),
        route("/api/playground", M::POST, post(crate::gateway::playground)),
        route("/api/repack", M::GET, get(repack::repack_plan)),
        route("/api/repack", M::POST, post(repack::start_repack)),
        route("/api/repack/run", M::GET, get(repack::repack_run)),
        route("/api/repack/stop", M::POST, post(repack::stop_repack)),
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

#[cfg(test)]
mod tests;
