//! Why a call into the core cannot do what was asked. No HTTP here: the REST edge (`api/`) says which
//! status and body each error answers with. What stops the server at start is [`crate::ServerError`].

/// A call that cannot be done as asked; each kind answers with its own HTTP status at the edge.
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
        verdict: Box<placement::Verdict>,
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
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> ApiError {
        ApiError::Internal(format!("database: {e}"))
    }
}
