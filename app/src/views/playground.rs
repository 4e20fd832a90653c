//! The playground: the models that can be tried there and the logs of the one on show.

use serde::{Deserialize, Serialize};

/// The playground: the models that can be tried, and the last log lines of the one on show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Playground {
    /// The models (and workers) with an engine now, by name.
    pub models: Vec<String>,
    /// The last lines of the first engine of the model on show (the first model when none is chosen),
    /// secrets redacted for everyone but admins.
    pub logs: Vec<String>,
}
