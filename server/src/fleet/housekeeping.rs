//! Housekeeping: raw GPU readings rolled up, old usage and audit entries deleted, every hour off the request
//! path. It knows the fleet's tables, so it lives with the fleet and is handed the pool: the database module
//! below stays free of what is stored in it.

use sqlx::SqlitePool;
use std::time::Duration;

/// How long what grows with time is kept; `None` keeps it for good. See docs/src/operations.md, "Retention".
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
        tidied.samples_rolled_up = super::usage::roll_up_samples(pool, before(keep), pause).await?;
    }
    if let Some(keep) = retention.usage {
        tidied.usage_deleted = super::usage::forget_usage_before(pool, before(keep), pause).await?;
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
        let now = super::usage::now_ms();
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
