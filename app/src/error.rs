//! The one error type the console's server functions answer with.

use leptos::server_fn::codec::JsonEncoding;
use leptos::server_fn::error::{FromServerFnError, ServerFnErrorErr};
use serde::{Deserialize, Serialize};

/// What went wrong, in a sentence a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum AppError {
    /// The request names something that does not exist or cannot be taken as sent.
    #[error("{0}")]
    BadRequest(String),
    /// The call itself failed: the network, or encoding on either side.
    #[error("The server could not be reached or answered oddly: {0}")]
    Transport(String),
}

impl FromServerFnError for AppError {
    type Encoder = JsonEncoding;

    fn from_server_fn_error(value: ServerFnErrorErr) -> Self {
        AppError::Transport(value.to_string())
    }
}
