//! The one error type the console's server functions answer with.

use leptos::server_fn::codec::JsonEncoding;
use leptos::server_fn::error::{FromServerFnError, ServerFnErrorErr};
use serde::{Deserialize, Serialize};

/// What went wrong, in a sentence a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum AppError {
    /// The request cannot be taken as sent (400).
    #[error("{0}")]
    BadRequest(String),
    /// Nobody is signed in (401).
    #[error("{0}")]
    Unauthorized(String),
    /// The caller's role does not allow it (403).
    #[error("{0}")]
    Forbidden(String),
    /// It names something that does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// Someone changed it first, or the name is taken (409): read it again.
    #[error("{0}")]
    Conflict(String),
    /// Well-formed, but the rules refuse it (422).
    #[error("{0}")]
    Refused(String),
    /// The call itself failed: the network, or encoding on either side.
    #[error("The server could not be reached or answered oddly: {0}")]
    Transport(String),
}

impl AppError {
    /// The HTTP status the server answers this error with.
    pub fn status(&self) -> u16 {
        match self {
            AppError::BadRequest(_) => 400,
            AppError::Unauthorized(_) => 401,
            AppError::Forbidden(_) => 403,
            AppError::NotFound(_) => 404,
            AppError::Conflict(_) => 409,
            AppError::Refused(_) => 422,
            AppError::Transport(_) => 500,
        }
    }
}

impl FromServerFnError for AppError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        AppError::Transport(value.to_string())
    }
}
