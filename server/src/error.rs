//! What can stop the server.

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
    /// Serving failed.
    #[error("the server stopped: {0}")]
    Serve(std::io::Error),
}
