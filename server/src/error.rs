//! What can stop the server, and why a call into the core cannot do what was asked. No HTTP here: the REST
//! edge (`api.rs`) says which status and body each error answers with.

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
    /// `--here` names no machine that can be this one.
    #[error("{0}")]
    Here(String),
    /// The Ray cluster asked for is not usable.
    #[error("{0}; check --ray (TESSERA_RAY) and --ray-token")]
    Ray(#[from] crate::inventory::ray::RayError),
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
