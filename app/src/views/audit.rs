//! The Audit page: the log's entries and what the page narrows it to.

use serde::{Deserialize, Serialize};

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditLine {
    /// Its number.
    pub id: i64,
    /// When.
    pub at: String,
    /// Who.
    pub actor: String,
    /// What kind of change.
    pub action: String,
    /// What it was done to.
    pub target: String,
    /// Before, as JSON text.
    pub before: Option<String>,
    /// After, as JSON text.
    pub after: Option<String>,
    /// The revision it made.
    pub revision: Option<i64>,
    /// Who restarted.
    pub restarts: Vec<String>,
    /// The address the change came from.
    #[serde(default)]
    pub client: Option<String>,
    /// What it changed, field by field: `shares.glm-5.3: 40.0 → 30.0`.
    #[serde(default)]
    pub changes: Vec<String>,
}

/// Entries the Audit page shows at once; the next page is those older than its last.
pub const AUDIT_PAGE: usize = 50;

/// What the Audit page narrows the log to; empty fields leave it wide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditQuery {
    /// Only this account's changes.
    pub actor: String,
    /// Only this kind (or family: `plan`) of change.
    pub action: String,
    /// Only changes to this.
    pub target: String,
    /// Only entries older than this one: the next page.
    #[serde(default)]
    pub before: Option<i64>,
}
