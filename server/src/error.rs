//! What can stop the server, and what an API call answers when it cannot do what was asked.

use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::path::PathBuf;

/// Why the server could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The console's build settings could not be read.
    #[error("could not read the console's settings (build it with cargo leptos): {0}")]
    LeptosConfig(#[from] leptos::config::errors::LeptosConfigError),
    /// The address is taken or not ours.
    #[error("could not listen on {addr}: {source}; pass another --listen address")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The data folder cannot be made.
    #[error("could not create the data folder {}: {source}; pass another --data-dir", dir.display())]
    DataDir {
        /// The folder.
        dir: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The database cannot be opened or migrated.
    #[error("the database could not be opened or migrated: {0}; check DATABASE_URL or --data-dir")]
    Database(#[source] sqlx::Error),
    /// The inventory file is malformed.
    #[error("{0}")]
    InventoryFile(#[from] crate::inventory::file::InventoryFileError),
    /// The machines from all sources contradict each other.
    #[error("the inventory cannot be used: {0}")]
    Inventory(#[from] placement::InventoryError),
    /// The stored state could not be loaded.
    #[error("the stored workers could not be loaded: {0}")]
    Load(ApiError),
    /// The server's own binary cannot be found, to run the demo engine from.
    #[error("could not find this program's own path (to run the demo engine): {0}")]
    Exe(std::io::Error),
    /// Serving failed.
    #[error("the server stopped: {0}")]
    Serve(std::io::Error),
}

/// An API call that cannot be done as asked. Answered as `{"error": "..."}` with the status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON (400).
    #[error("{0}")]
    BadRequest(String),
    /// No session and no API token (401).
    #[error("{0}")]
    Unauthorized(String),
    /// The caller's role does not allow it, or a browser's change lacks its CSRF token (403).
    #[error("{0}")]
    Forbidden(String),
    /// The request body is larger than any route takes (413).
    #[error("{0}")]
    TooLarge(String),
    /// Nothing by that name (404).
    #[error("{0}")]
    NotFound(String),
    /// The name is taken, or the revision is stale (409).
    #[error("{0}")]
    Conflict(String),
    /// Well-formed, but the rules refuse it (422).
    #[error("{0}")]
    Unprocessable(String),
    /// A share plan the rules refuse (422), answered with the whole verdict beside the first problem.
    #[error("{message}")]
    Refused {
        /// The first problem, naming its member.
        message: String,
        /// Every problem.
        verdict: Box<crate::api::VerdictView>,
    },
    /// Our fault (500): logged in full, answered opaquely.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// An internal error from anything that can be shown.
    pub fn internal(e: impl std::fmt::Display) -> ApiError {
        ApiError::Internal(e.to_string())
    }

    /// A unique-constraint violation becomes 409 with `message`; anything else is internal.
    pub fn on_unique(e: sqlx::Error, message: impl FnOnce() -> String) -> ApiError {
        match &e {
            sqlx::Error::Database(db) if db.is_unique_violation() => ApiError::Conflict(message()),
            _ => ApiError::from(e),
        }
    }

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

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        ApiError::Internal(format!("database: {e}"))
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
            let body = serde_json::json!({ "error": message, "verdict": verdict });
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
