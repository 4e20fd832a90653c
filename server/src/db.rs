//! The database: SQLite through sqlx by default (a file in the data folder, WAL), migrations at start.

use crate::error::ServerError;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

/// Opens the database named by `database_url`, or `tessera.db` in `data_dir`, and applies the migrations.
pub async fn connect(
    database_url: Option<&str>,
    data_dir: &Path,
) -> Result<SqlitePool, ServerError> {
    let options = match database_url {
        Some(url) => SqliteConnectOptions::from_str(url).map_err(ServerError::Database)?,
        None => {
            std::fs::create_dir_all(data_dir).map_err(|source| ServerError::DataDir {
                dir: data_dir.to_path_buf(),
                source,
            })?;
            SqliteConnectOptions::new().filename(data_dir.join("tessera.db"))
        }
    }
    .create_if_missing(true)
    .journal_mode(SqliteJournalMode::Wal)
    .foreign_keys(true)
    .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .map_err(ServerError::Database)?;
    sqlx::migrate!("./migrations")
        .run(&pool)
        .await
        .map_err(|e| ServerError::Database(e.into()))?;
    Ok(pool)
}

/// Begins a write transaction that takes SQLite's write lock at once (`BEGIN IMMEDIATE`), waiting up to the
/// busy timeout for it. A deferred transaction that reads first and writes later fails outright, without
/// waiting, when another connection (the runtime recording an engine, say) wrote in between.
pub async fn write(
    pool: &SqlitePool,
) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
    pool.begin_with("BEGIN IMMEDIATE").await
}

/// How long what grows with time is kept; `None` keeps it for good. See the README's "Retention".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// GPU readings (every 5 s per GPU) are kept raw this long, then rolled up into runs that keep the
    /// usage report's figures (whole hours exactly).
    pub raw_samples: Option<Duration>,
    /// Usage: closed holdings and rolled-up readings are deleted this long after they end.
    pub usage: Option<Duration>,
    /// Audit entries are deleted this long after they were written.
    pub audit: Option<Duration>,
}

/// A day.
const DAY: Duration = Duration::from_secs(24 * 3600);

impl Default for Retention {
    /// Raw readings for a week; usage and the audit log for 400 days (a year's reports, and some).
    fn default() -> Retention {
        Retention {
            raw_samples: Some(7 * DAY),
            usage: Some(400 * DAY),
            audit: Some(400 * DAY),
        }
    }
}

impl Retention {
    /// `days` of each; 0 keeps it for good.
    pub fn days(raw_samples: u32, usage: u32, audit: u32) -> Retention {
        let days = |n: u32| (n > 0).then(|| DAY * n);
        Retention {
            raw_samples: days(raw_samples),
            usage: days(usage),
            audit: days(audit),
        }
    }
}

/// What one round of housekeeping did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tidied {
    /// Raw GPU readings rolled up.
    pub samples_rolled_up: u64,
    /// Closed holdings and runs of readings deleted.
    pub usage_deleted: u64,
    /// Audit entries deleted.
    pub audit_deleted: u64,
}

/// One round of housekeeping as of `now_ms`: raw readings older than their retention are rolled up, then
/// the usage and the audit entries older than theirs are deleted. Each step works in short transactions,
/// `pause` apart; a round cut short (the server killed) leaves nothing half done, and the next round goes
/// on from there.
pub async fn tidy(
    pool: &SqlitePool,
    retention: &Retention,
    now_ms: u64,
    pause: Duration,
) -> Result<Tidied, sqlx::Error> {
    let before = |keep: Duration| now_ms.saturating_sub(keep.as_millis() as u64);
    let mut tidied = Tidied::default();
    // Raw readings are never kept longer than the usage they would count in.
    let raw = match (retention.raw_samples, retention.usage) {
        (Some(raw), Some(usage)) => Some(raw.min(usage)),
        (raw, usage) => raw.or(usage),
    };
    if let Some(keep) = raw {
        tidied.samples_rolled_up =
            crate::fleet::usage::roll_up_samples(pool, before(keep), pause).await?;
    }
    if let Some(keep) = retention.usage {
        tidied.usage_deleted =
            crate::fleet::usage::forget_usage_before(pool, before(keep), pause).await?;
    }
    if let Some(keep) = retention.audit {
        tidied.audit_deleted = crate::audit::forget_before(pool, before(keep), pause).await?;
    }
    Ok(tidied)
}

/// How often housekeeping runs.
const TIDY_EVERY: Duration = Duration::from_secs(3600);

/// The pause between housekeeping's transactions: longer than SQLite's longest wait between two tries
/// for the lock (100 ms), so that a change waiting for it gets it.
const TIDY_PAUSE: Duration = Duration::from_millis(150);

/// Runs [`tidy`] at start and every hour, off the request path, for as long as the server runs.
pub async fn keep_tidy(pool: SqlitePool, retention: Retention) {
    let mut every = tokio::time::interval(TIDY_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let now = crate::fleet::usage::now_ms();
        match tidy(&pool, &retention, now, TIDY_PAUSE).await {
            Ok(t) if t == Tidied::default() => {}
            Ok(t) => tracing::info!(
                "housekeeping: {} GPU readings rolled up, {} old usage rows and {} audit entries deleted",
                t.samples_rolled_up,
                t.usage_deleted,
                t.audit_deleted
            ),
            Err(e) => tracing::warn!("housekeeping stopped short (it carries on next time): {e}"),
        }
    }
}

/// A row of `workers`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WorkerRow {
    /// Arrival order.
    pub seq: i64,
    /// The worker's name.
    pub name: String,
    /// `requested_resources` as accepted, JSON.
    pub request: String,
    /// The command to run, if given.
    pub command: Option<String>,
    /// Environment variables, a JSON object.
    pub env: String,
    /// `placed` or `pending`.
    pub state: String,
    /// `placement::Assignment` as JSON, when placed.
    pub assignment: Option<String>,
    /// The pending reasons, a JSON array of sentences.
    pub pending_reasons: String,
    /// Bumped at every change the server makes to the row.
    pub revision: i64,
    /// The catalog model it runs, for a model deployed on whole GPUs.
    pub model: Option<String>,
    /// That deployment's extra arguments, a JSON array.
    pub args: String,
}

/// Every worker, oldest first.
pub async fn workers<'e, E: sqlx::SqliteExecutor<'e>>(
    db: E,
) -> Result<Vec<WorkerRow>, sqlx::Error> {
    sqlx::query_as::<_, WorkerRow>(
        "SELECT seq, name, request, command, env, state, assignment, pending_reasons, revision, model, args \
         FROM workers ORDER BY seq",
    )
    .fetch_all(db)
    .await
}

/// One worker by name.
pub async fn worker<'e, E: sqlx::SqliteExecutor<'e>>(
    db: E,
    name: &str,
) -> Result<Option<WorkerRow>, sqlx::Error> {
    sqlx::query_as::<_, WorkerRow>(
        "SELECT seq, name, request, command, env, state, assignment, pending_reasons, revision, model, args \
         FROM workers WHERE name = ?",
    )
    .bind(name)
    .fetch_optional(db)
    .await
}
