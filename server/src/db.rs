//! The database: SQLite through sqlx by default (a file in the data folder, WAL), migrations at start.

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

/// Why the database could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
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
}

pub mod backup;

/// Every migration of this version of Tessera, from `migrations/`: applied at start, in order. A released
/// one is never edited: `migrations/SHA256SUMS` holds each file's checksum, which a test compares.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// The database's file in the data folder.
pub const FILE: &str = "tessera.db";

/// Opens the database named by `database_url`, or `tessera.db` in `data_dir`, and applies the migrations.
pub async fn connect(database_url: Option<&str>, data_dir: &Path) -> Result<SqlitePool, OpenError> {
    if database_url.is_none() {
        std::fs::create_dir_all(data_dir).map_err(|source| OpenError::DataDir {
            dir: data_dir.to_path_buf(),
            source,
        })?;
    }
    let pool = pool(options(database_url, data_dir)?.create_if_missing(true)).await?;
    MIGRATOR
        .run(&pool)
        .await
        .map_err(|e| OpenError::Database(e.into()))?;
    Ok(pool)
}

/// Opens the database as it is, for a command that reads it beside the server (`tessera backup`): it is
/// neither made where missing nor migrated.
pub async fn open_existing(
    database_url: Option<&str>,
    data_dir: &Path,
) -> Result<SqlitePool, OpenError> {
    pool(options(database_url, data_dir)?).await
}

/// The database as it is, read only: nothing written, no journal or shared-memory file made where none
/// is (`tessera doctor`, which may run as root beside a service that runs as its own user: a file it
/// made would be root's, and the service could not write the database).
pub async fn open_read_only(
    database_url: Option<&str>,
    data_dir: &Path,
) -> Result<SqlitePool, OpenError> {
    let options = named(database_url, data_dir)?;
    let beside = |suffix: &str| {
        let mut name = options.get_filename().as_os_str().to_owned();
        name.push(suffix);
        Path::new(&name).exists()
    };
    // Without a write-ahead log and its shared-memory file beside it (its server stopped, and the stop
    // folded the log back in or left the log alone), even a read-only connection makes what is missing;
    // the file is then read as unchangeable and nothing is made (a log left alone is not read: the
    // database as of its last checkpoint). With both, the log's pages are read too.
    let immutable = !(beside("-wal") && beside("-shm"));
    pool(
        options
            .read_only(true)
            .create_if_missing(false)
            .immutable(immutable),
    )
    .await
}

/// The database named by `database_url`, or `tessera.db` in `data_dir`.
fn named(database_url: Option<&str>, data_dir: &Path) -> Result<SqliteConnectOptions, OpenError> {
    match database_url {
        Some(url) => SqliteConnectOptions::from_str(url).map_err(OpenError::Database),
        None => Ok(SqliteConnectOptions::new().filename(data_dir.join(FILE))),
    }
}

/// How the database named by `database_url`, or `tessera.db` in `data_dir`, is opened.
pub fn options(
    database_url: Option<&str>,
    data_dir: &Path,
) -> Result<SqliteConnectOptions, OpenError> {
    Ok(named(database_url, data_dir)?
        .journal_mode(SqliteJournalMode::Wal)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(5)))
}

async fn pool(options: SqliteConnectOptions) -> Result<SqlitePool, OpenError> {
    SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .map_err(OpenError::Database)
}

/// Begins a write transaction that takes SQLite's write lock at once (`BEGIN IMMEDIATE`), waiting up to the
/// busy timeout for it. A deferred transaction that reads first and writes later fails outright, without
/// waiting, when another connection (the runtime recording an engine, say) wrote in between.
pub async fn write(
    pool: &SqlitePool,
) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
    pool.begin_with("BEGIN IMMEDIATE").await
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
