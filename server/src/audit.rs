//! The audit log: every change, who made it and when, what it was before and after, the plan revision it
//! made and who restarted. Each entry is written in the same transaction as the change it records, so the
//! log never tells of a change that did not happen, nor misses one that did.
//! Entries older than the audit retention (400 days by default) are deleted by the housekeeping in
//! [`crate::fleet::housekeeping::tidy`].

use crate::error::ApiError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{SqliteConnection, SqlitePool};
use std::collections::{BTreeMap, BTreeSet};

/// The actor of what the server does by itself (the demo catalog it seeds, say).
pub const TESSERA: &str = "tessera";

/// The most entries one read answers.
pub const MAX_ENTRIES: i64 = 1000;

tokio::task_local! {
    /// The address of the client whose request is being served: each entry its changes write names it.
    static CLIENT: String;
}

/// Runs `work` as serving the client at `address`, where there is one: the entries it writes name it.
pub async fn for_client<F: std::future::Future>(address: Option<String>, work: F) -> F::Output {
    match address {
        Some(address) => CLIENT.scope(address, work).await,
        None => work.await,
    }
}

/// The client whose request is being served, where one is.
pub fn client() -> Option<String> {
    CLIENT.try_with(Clone::clone).ok()
}

/// An entry about to be written.
#[derive(Debug, Clone)]
pub struct Entry {
    actor: String,
    action: String,
    target: String,
    before: Option<Value>,
    after: Option<Value>,
    revision: Option<i64>,
    restarts: Vec<String>,
}

impl Entry {
    /// `actor` did `action` (such as `plan.change`) to `target`.
    pub fn new(actor: &str, action: &str, target: &str) -> Entry {
        Entry {
            actor: actor.to_owned(),
            action: action.to_owned(),
            target: target.to_owned(),
            before: None,
            after: None,
            revision: None,
            restarts: Vec::new(),
        }
    }

    /// What it was before.
    pub fn before(mut self, before: Value) -> Entry {
        self.before = Some(before);
        self
    }

    /// What it is after.
    pub fn after(mut self, after: Value) -> Entry {
        self.after = Some(after);
        self
    }

    /// The plan (or worker) revision the change made.
    pub fn revision(mut self, revision: i64) -> Entry {
        self.revision = Some(revision);
        self
    }

    /// The models that restart because of it.
    pub fn restarts(mut self, restarts: Vec<String>) -> Entry {
        self.restarts = restarts;
        self
    }
}

/// Writes `entry` inside the change's own transaction.
pub async fn record(tx: &mut SqliteConnection, entry: Entry) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO audit (actor, action, target, before, after, revision, restarts, client) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&entry.actor)
    .bind(&entry.action)
    .bind(&entry.target)
    .bind(entry.before.as_ref().map(Value::to_string))
    .bind(entry.after.as_ref().map(Value::to_string))
    .bind(entry.revision)
    .bind(serde_json::Value::from(entry.restarts).to_string())
    .bind(client())
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// An entry as the API and the Audit page show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Its number, in the order written.
    pub id: i64,
    /// When, RFC 3339.
    pub at: String,
    /// Who: an account's name (or `tessera` for what the server does by itself).
    pub actor: String,
    /// What, such as `deploy`, `plan.change`, `worker.create`, `token.revoke`.
    pub action: String,
    /// What it was done to: a model, a group, a worker, an account.
    pub target: String,
    /// Before the change.
    pub before: Option<Value>,
    /// After it.
    pub after: Option<Value>,
    /// The revision it made.
    pub revision: Option<i64>,
    /// The models that restarted.
    pub restarts: Vec<String>,
    /// The address of the client whose request made it; none for what the server did by itself.
    pub client: Option<String>,
}

/// Which entries to read: each field narrows it; newest first.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditFilter {
    /// Only this account's changes.
    pub actor: Option<String>,
    /// Only this kind of change, or a family of them (`plan` takes `plan.change`).
    pub action: Option<String>,
    /// Only changes to this.
    pub target: Option<String>,
    /// At most this many (100 unless said, at most 1000).
    pub limit: Option<i64>,
    /// Only entries older than this one (its id): the next page.
    pub before: Option<i64>,
}

/// The entries `filter` picks, newest first.
pub async fn entries(pool: &SqlitePool, filter: &AuditFilter) -> Result<Vec<AuditEntry>, ApiError> {
    let limit = filter.limit.unwrap_or(100);
    if !(1..=MAX_ENTRIES).contains(&limit) {
        return Err(ApiError::Unprocessable(format!(
            "limit must be from 1 to {MAX_ENTRIES}, not {limit}"
        )));
    }
    type Row = (
        i64,
        String,
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        Option<i64>,
        String,
        Option<String>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT id, at, actor, action, target, before, after, revision, restarts, client FROM audit \
         WHERE (?1 IS NULL OR actor = ?1) \
           AND (?2 IS NULL OR action = ?2 OR action LIKE ?2 || '.%') \
           AND (?3 IS NULL OR target = ?3) \
           AND (?5 IS NULL OR id < ?5) \
         ORDER BY id DESC LIMIT ?4",
    )
    .bind(filter.actor.as_deref().filter(|s| !s.is_empty()))
    .bind(filter.action.as_deref().filter(|s| !s.is_empty()))
    .bind(filter.target.as_deref().filter(|s| !s.is_empty()))
    .bind(limit)
    .bind(filter.before)
    .fetch_all(pool)
    .await?;
    // Entries written before secrets were kept out of the log are redacted as they are read.
    let json = |text: Option<String>| -> Result<Option<Value>, ApiError> {
        text.map(|t| {
            serde_json::from_str(&t)
                .map(|v| crate::redact::redact_json(v, &[]))
                .map_err(ApiError::internal)
        })
        .transpose()
    };
    rows.into_iter()
        .map(
            |(id, at, actor, action, target, before, after, revision, restarts, client)| {
                Ok(AuditEntry {
                    id,
                    at,
                    actor,
                    action,
                    target,
                    before: json(before)?,
                    after: json(after)?,
                    revision,
                    restarts: serde_json::from_str(&restarts).map_err(ApiError::internal)?,
                    client,
                })
            },
        )
        .collect()
}

/// What an entry changed, field by field: `members.glm-5.3.share: 4000 → 5500`, `gpus: none → ["atlas:0"]`.
/// Objects are walked by key, lists of named things by name (so a member added to a plan is one line, not
/// every member after it moved up), other lists by position; at most [`CHANGES_SHOWN`] lines, then a count.
pub fn changed_fields(before: Option<&Value>, after: Option<&Value>) -> Vec<String> {
    let mut was = BTreeMap::new();
    let mut now = BTreeMap::new();
    if let Some(before) = before {
        flatten(String::new(), before, &mut was);
    }
    if let Some(after) = after {
        flatten(String::new(), after, &mut now);
    }
    let mut lines: Vec<String> = was
        .keys()
        .chain(now.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|path| was.get(*path) != now.get(*path))
        .map(|path| {
            let side = |v: Option<&String>| v.cloned().unwrap_or_else(|| "none".to_owned());
            let name = if path.is_empty() {
                "value"
            } else {
                path.as_str()
            };
            format!("{name}: {} → {}", side(was.get(path)), side(now.get(path)))
        })
        .collect();
    if lines.len() > CHANGES_SHOWN {
        let more = lines.len() - CHANGES_SHOWN;
        lines.truncate(CHANGES_SHOWN);
        lines.push(format!("and {more} more"));
    }
    lines
}

/// The most changed fields an entry lists.
const CHANGES_SHOWN: usize = 20;

/// Each scalar of `value` under its path.
fn flatten(path: String, value: &Value, out: &mut BTreeMap<String, String>) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match value {
        Value::Object(fields) => {
            for (key, value) in fields {
                flatten(join(key), value, out);
            }
        }
        Value::Array(items) => {
            let name_of = |item: &Value| {
                ["name", "member", "model"]
                    .iter()
                    .find_map(|k| item.get(k).and_then(Value::as_str).map(str::to_owned))
            };
            let named: Option<Vec<String>> = items.iter().map(name_of).collect();
            match named.filter(|names| {
                names.iter().collect::<BTreeSet<_>>().len() == names.len() && !names.is_empty()
            }) {
                Some(names) => {
                    for (name, item) in names.iter().zip(items) {
                        flatten(join(name), item, out);
                    }
                }
                // A list of plain values reads best whole.
                None if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
                    out.insert(path, value.to_string());
                }
                None => {
                    for (i, item) in items.iter().enumerate() {
                        flatten(join(&i.to_string()), item, out);
                    }
                }
            }
        }
        scalar => {
            out.insert(path, scalar.to_string());
        }
    }
}

/// The most entries one retention transaction deletes.
const FORGET_BATCH: i64 = 1000;

/// Deletes the entries written before `before_ms` (milliseconds since the epoch), oldest first,
/// [`FORGET_BATCH`] to a transaction with `pause` between them, so that no change waits long on the write
/// lock. How many.
pub async fn forget_before(
    pool: &SqlitePool,
    before_ms: u64,
    pause: std::time::Duration,
) -> Result<u64, sqlx::Error> {
    let mut forgotten = 0;
    loop {
        let mut tx = crate::db::write(pool).await?;
        // `at` as the table writes it: 2026-12-01T00:00:00.000Z, which sorts as the time does.
        let n = sqlx::query(
            "DELETE FROM audit WHERE id IN (SELECT id FROM audit \
             WHERE at < strftime('%Y-%m-%dT%H:%M:%S', ?1 / 1000, 'unixepoch') || printf('.%03dZ', ?1 % 1000) \
             ORDER BY id LIMIT ?2)",
        )
        .bind(before_ms as i64)
        .bind(FORGET_BATCH)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        forgotten += n;
        if n < FORGET_BATCH as u64 {
            return Ok(forgotten);
        }
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests;
