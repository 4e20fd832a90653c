//! The playground: the models that can be tried there and the logs of the one on show.

use serde::{Deserialize, Serialize};

/// The playground: the models that can be tried, and the last log lines of the one on show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Playground {
    /// The deployed models with an engine now or loaded on demand, by name (workers run jobs, not chats).
    pub models: Vec<String>,
    /// The last lines of an engine of the model on show (the first model when none is chosen), the one
    /// most able to serve, secrets redacted for everyone but admins.
    pub logs: Vec<String>,
    /// Which engine the lines are from and how it is now: `on atlas: Restarting: exited with status 1`, so
    /// that a crashed run's last lines are read as such.
    #[serde(default)]
    pub engine: Option<String>,
}
