//! Backups: a consistent copy of the live database (`VACUUM INTO`, while the server runs and writes), and
//! a copy put back in the database's place, only while no server runs on the data folder. That is known by
//! the lock file every server holds for its life ([`DataLock`]), which a restore takes too.

use super::MIGRATOR;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use std::fs::{File, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The lock file's name, in the data folder.
const LOCK: &str = "tessera.lock";

/// Why a backup or a restore was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A backup never overwrites a file.
    #[error("{} already exists: a backup never overwrites a file; name another", .0.display())]
    Exists(PathBuf),
    /// A server (or another restore) holds the data folder.
    #[error(transparent)]
    Locked(#[from] LockError),
    /// The file to restore is not an SQLite database.
    #[error("{} is not an SQLite database: {source}", path.display())]
    NotADatabase {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: sqlx::Error,
    },
    /// The file is an SQLite database, damaged.
    #[error("{} fails SQLite's integrity check: {report}", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// `PRAGMA integrity_check`'s first lines.
        report: String,
    },
    /// The file is an SQLite database, but not one of Tessera's.
    #[error("{} is not a Tessera database: {why}", path.display())]
    NotTessera {
        /// The file.
        path: PathBuf,
        /// What it lacks.
        why: String,
    },
    /// The database is named by a URL that is no file (`sqlite::memory:`).
    #[error("the database is not a file ({0}): there is nothing to restore into")]
    NotAFile(String),
    /// Reading or writing a file failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The database cannot be opened.
    #[error(transparent)]
    Open(#[from] super::OpenError),
    /// The database failed.
    #[error("the database: {0}")]
    Database(#[from] sqlx::Error),
}

/// Why the data folder's lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Someone holds it: a server, or a restore under way.
    #[error(
        "a Tessera server{} runs on the data folder {} (it holds {LOCK}), or a restore is under way: stop it first (systemctl stop tessera)",
        holder.map_or(String::new(), |pid| format!(" (pid {pid})")),
        dir.display()
    )]
    Held {
        /// The data folder.
        dir: PathBuf,
        /// The process id the holder wrote in the file, where it did.
        holder: Option<u32>,
    },
    /// The lock file cannot be made or locked.
    #[error("could not lock {}: {source}; pass another --data-dir", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// The data folder held by this process, until dropped (the OS lets go of it when the process ends, a
/// crash included): a server holds it for its life, a restore while it replaces the database.
#[derive(Debug)]
pub struct DataLock {
    _file: File,
}

impl DataLock {
    /// Takes the lock of `data_dir` (made where missing), or says who holds it; never waits.
    pub fn take(data_dir: &Path) -> Result<DataLock, LockError> {
        let path = data_dir.join(LOCK);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(data_dir).map_err(io)?;
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|pid| pid.trim().parse().ok());
                return Err(LockError::Held {
                    dir: data_dir.to_path_buf(),
                    holder,
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        // A lock file a restore run as root made is still the server's to open; best effort, as the
        // server itself runs as the folder's owner.
        let _ = own_like(&path, data_dir);
        // Who holds it, for the message another process gives.
        file.set_len(0).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(DataLock { _file: file })
    }
}

impl DataLock {
    /// Whether a process holds the lock of `data_dir`. Writes nothing: no folder, no lock file, no PID
    /// (`tessera doctor`, run as root before the service's first start, would leave them root's).
    pub fn is_held(data_dir: &Path) -> bool {
        File::open(data_dir.join(LOCK))
            .is_ok_and(|file| matches!(file.try_lock(), Err(TryLockError::WouldBlock)))
    }
}

/// Copies the database behind `pool` into `to`, a new file, as one consistent snapshot: writes that commit
/// meanwhile go on (WAL) and are not in the copy; every write committed before it began is.
pub async fn backup(pool: &SqlitePool, to: &Path) -> Result<(), BackupError> {
    if to.exists() {
        return Err(BackupError::Exists(to.to_path_buf()));
    }
    let Some(name) = to.to_str() else {
        return Err(BackupError::Io {
            what: "cannot name",
            path: to.to_path_buf(),
            source: std::io::Error::other("the path is not UTF-8"),
        });
    };
    sqlx::query("VACUUM INTO ?")
        .bind(name)
        .execute(pool)
        .await?;
    // SQLite does not sync the file VACUUM INTO writes: a backup is meant to outlive a power cut.
    File::open(to)
        .and_then(|file| file.sync_all())
        .map_err(|source| BackupError::Io {
            what: "could not sync",
            path: to.to_path_buf(),
            source,
        })
}

/// What a restore put back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The database file replaced.
    pub database: PathBuf,
    /// The backup's latest migration.
    pub version: i64,
    /// This Tessera's latest migration: those after the backup's run at the server's next start.
    pub latest: i64,
}

/// Whose a restored database is: which installation's engines its server adopts (its identity, the token
/// they carry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installation {
    /// That of the database it replaces (a roll-back in place, a staging server's own), or a new one where
    /// there was none: never that of the server the backup was taken from, whose engines a copy must
    /// neither adopt nor stop.
    Here,
    /// That of the installation the backup was taken from, which this server replaces (a machine replaced
    /// in place).
    Backed,
}

/// Puts the backup `from` in the place of the database (named by `database_url`, or `tessera.db` in
/// `data_dir`, as [`super::connect`] names it), whose server keeps its lock in `data_dir`. Refused while that lock is held, and for a file that is not a whole Tessera database of
/// this version or an older one. The database is replaced at once (a new file beside it, renamed over
/// it), its WAL with it; a restore that stops halfway leaves the old database whole.
pub async fn restore(
    from: &Path,
    database_url: Option<&str>,
    data_dir: &Path,
    installation: Installation,
) -> Result<Restored, BackupError> {
    if let Some(url) = database_url.filter(|u| u.contains(":memory:") || u.contains("mode=memory"))
    {
        return Err(BackupError::NotAFile(url.to_owned()));
    }
    let options = super::options(database_url, data_dir)?;
    let database = options.get_filename().to_path_buf();
    let _lock = DataLock::take(data_dir)?;
    if !from.is_file() {
        return Err(BackupError::Io {
            what: "no file to restore at",
            path: from.to_path_buf(),
            source: std::io::ErrorKind::NotFound.into(),
        });
    }
    let copy = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(SqliteConnectOptions::new().filename(from).read_only(true))
        .await
        .map_err(|source| BackupError::NotADatabase {
            path: from.to_path_buf(),
            source,
        })?;
    let version = check(&copy, from).await?;
    let beside = sibling(&database, "restoring");
    remove_if_there(&beside)?;
    // One self-contained file, whatever WAL the backup had folded in.
    let written = backup(&copy, &beside).await;
    copy.close().await;
    written?;
    let identity = match installation {
        Installation::Here => Some(identity_of(&options).await),
        Installation::Backed => None,
    };
    set_identity(&beside, identity).await?;
    // Run as root (sudo), the restore still leaves the server a database it may write.
    let like = if database.exists() {
        database.clone()
    } else {
        folder_of(&database).to_path_buf()
    };
    own_like(&beside, &like)?;
    checkpoint(&options).await;
    for stale in [sibling(&database, "wal"), sibling(&database, "shm")] {
        remove_if_there(&stale)?;
    }
    std::fs::rename(&beside, &database).map_err(|source| BackupError::Io {
        what: "could not rename the restored copy over",
        path: database.clone(),
        source,
    })?;
    // The rename itself outlives a power cut only once the folder is synced.
    let folder = folder_of(&database);
    File::open(folder)
        .and_then(|dir| dir.sync_all())
        .map_err(|source| BackupError::Io {
            what: "could not sync the folder",
            path: folder.to_path_buf(),
            source,
        })?;
    Ok(Restored {
        database,
        version,
        latest: MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0),
    })
}

/// An instance token and where its database was last opened (`instance`, migration 3 on).
type Identity = (String, Option<String>);

/// The identity the database at `options` keeps; none where it has none or cannot be read (it is being
/// restored over).
async fn identity_of(options: &SqliteConnectOptions) -> Option<Identity> {
    if !options.get_filename().exists() {
        return None;
    }
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options.clone().read_only(true))
        .await
        .ok()?;
    let identity = sqlx::query_as("SELECT token, home FROM instance WHERE id = 1")
        .fetch_optional(&pool)
        .await
        .ok()
        .flatten();
    pool.close().await;
    identity
}

/// Gives the restored database `file` the identity `to` (the one it replaces; a new one where that is
/// `Some(None)`), or, where `to` is `None`, keeps its own with where it was opened forgotten, so that its
/// next server takes this place for its own.
async fn set_identity(file: &Path, to: Option<Option<Identity>>) -> Result<(), BackupError> {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(SqliteConnectOptions::new().filename(file))
        .await?;
    let set = async {
        let has_table: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'instance')",
        )
        .fetch_one(&pool)
        .await?;
        // A backup from before identities were kept gets one at its server's first start.
        if !has_table {
            return Ok(());
        }
        match to {
            None => {
                sqlx::query("UPDATE instance SET home = NULL")
                    .execute(&pool)
                    .await?;
            }
            Some(to) => {
                sqlx::query("DELETE FROM instance").execute(&pool).await?;
                if let Some((token, home)) = to {
                    sqlx::query("INSERT INTO instance (id, token, home) VALUES (1, ?, ?)")
                        .bind(token)
                        .bind(home)
                        .execute(&pool)
                        .await?;
                }
            }
        }
        Ok::<_, sqlx::Error>(())
    }
    .await;
    pool.close().await;
    Ok(set?)
}

/// Checks that `pool` holds a whole Tessera database this version can open: SQLite's integrity check,
/// then its migrations, each one of ours; answers the latest.
async fn check(pool: &SqlitePool, path: &Path) -> Result<i64, BackupError> {
    let report: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_all(pool)
        .await
        .map_err(|source| BackupError::NotADatabase {
            path: path.to_path_buf(),
            source,
        })?;
    if report != ["ok"] {
        return Err(BackupError::Damaged {
            path: path.to_path_buf(),
            report: report
                .iter()
                .take(3)
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join("; "),
        });
    }
    let not_tessera = |why: String| BackupError::NotTessera {
        path: path.to_path_buf(),
        why,
    };
    let applied: Vec<(i64, bool, Vec<u8>)> =
        sqlx::query_as("SELECT version, success, checksum FROM _sqlx_migrations ORDER BY version")
            .fetch_all(pool)
            .await
            .map_err(|_| not_tessera("it has no table of migrations".to_owned()))?;
    for (version, success, checksum) in &applied {
        let ours = MIGRATOR.iter().find(|m| m.version == *version);
        match ours {
            None => {
                return Err(not_tessera(format!(
                    "its migration {version} is not one this Tessera knows (a newer Tessera's backup? restore it with that one)"
                )))
            }
            Some(m) if *m.checksum != **checksum => {
                return Err(not_tessera(format!(
                    "its migration {version} differs from this Tessera's"
                )))
            }
            Some(_) if !success => {
                return Err(not_tessera(format!(
                    "its migration {version} failed halfway"
                )))
            }
            Some(_) => {}
        }
    }
    applied
        .last()
        .map(|(version, ..)| *version)
        .ok_or_else(|| not_tessera("no migration was ever applied to it".to_owned()))
}

/// Folds the old database's WAL into it, so that it stays whole if the restore stops before the rename.
/// Where the old database cannot even be opened (a damaged one, being restored over), it is replaced all
/// the same.
async fn checkpoint(options: &SqliteConnectOptions) {
    if !options.get_filename().exists() {
        return;
    }
    let folded = async {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&pool)
            .await?;
        pool.close().await;
        Ok::<_, sqlx::Error>(())
    };
    if let Err(e) = folded.await {
        tracing::warn!(
            "the database being replaced could not be checkpointed ({e}); replacing it all the same"
        );
    }
}

/// The folder `file` is in (`.` for a bare name).
fn folder_of(file: &Path) -> &Path {
    file.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Gives `path` the owner and group of `like` (and its mode, where `like` is a file): a file a command run
/// as root makes in the data folder must stay the server's to write.
fn own_like(path: &Path, like: &Path) -> Result<(), BackupError> {
    use std::os::unix::fs::MetadataExt;
    let (Ok(want), Ok(have)) = (std::fs::metadata(like), std::fs::metadata(path)) else {
        return Ok(());
    };
    let failed = |source| BackupError::Io {
        what: "could not give the server's owner (run the restore as the server's user) to",
        path: path.to_path_buf(),
        source,
    };
    if (want.uid(), want.gid()) != (have.uid(), have.gid()) {
        std::os::unix::fs::chown(path, Some(want.uid()), Some(want.gid())).map_err(failed)?;
    }
    if want.is_file() {
        std::fs::set_permissions(path, want.permissions()).map_err(failed)?;
    }
    Ok(())
}

/// `database` with `-suffix` after its name, as SQLite names its WAL (`tessera.db-wal`).
fn sibling(database: &Path, suffix: &str) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(format!("-{suffix}"));
    PathBuf::from(name)
}

fn remove_if_there(path: &Path) -> Result<(), BackupError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(BackupError::Io {
            what: "could not remove",
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use std::sync::Arc;

    async fn add_worker(pool: &SqlitePool, name: &str, padding: usize) -> i64 {
        sqlx::query_scalar(
            "INSERT INTO workers (name, request, state) VALUES (?, ?, 'pending') RETURNING seq",
        )
        .bind(name)
        .bind(format!("{{\"padding\": \"{}\"}}", "x".repeat(padding)))
        .fetch_one(pool)
        .await
        .unwrap()
    }

    async fn names(pool: &SqlitePool) -> Vec<String> {
        sqlx::query_scalar("SELECT name FROM workers ORDER BY seq")
            .fetch_all(pool)
            .await
            .unwrap()
    }

    async fn read_only(path: &Path) -> SqlitePool {
        SqlitePoolOptions::new()
            .connect_with(SqliteConnectOptions::new().filename(path).read_only(true))
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backup_under_writes_opens_whole_and_holds_every_write_committed_before_it_began() {
        let dir = tempfile::tempdir().unwrap();
        let pool = super::super::connect(None, dir.path()).await.unwrap();
        // Some megabytes, so that a copy takes long enough for writes to land while it runs.
        let mut tx = pool.begin().await.unwrap();
        for n in 0..3000 {
            sqlx::query("INSERT INTO workers (name, request, state) VALUES (?, ?, 'pending')")
                .bind(format!("bulk-{n}"))
                .bind("y".repeat(4000))
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicI64::new(0));
        let writer = tokio::spawn({
            let (pool, stop, committed) = (pool.clone(), stop.clone(), committed.clone());
            async move {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let seq = add_worker(&pool, &format!("w-{n}"), 100).await;
                    committed.store(seq, Ordering::SeqCst);
                    n += 1;
                }
            }
        });
        let mut written_meanwhile = 0;
        for i in 0..3 {
            while committed.load(Ordering::SeqCst) < 3000 + 20 * (i + 1) {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            let before = committed.load(Ordering::SeqCst);
            let to = dir.path().join(format!("backup-{i}.db"));
            backup(&pool, &to).await.unwrap();
            written_meanwhile += committed.load(Ordering::SeqCst) - before;
            let copy = read_only(&to).await;
            let report: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
                .fetch_all(&copy)
                .await
                .unwrap();
            assert_eq!(report, ["ok"]);
            let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM workers ORDER BY seq")
                .fetch_all(&copy)
                .await
                .unwrap();
            let last = *seqs.last().unwrap();
            assert!(
                last >= before,
                "backup {i} holds up to {last}, but {before} was committed before it began"
            );
            // One snapshot: every write up to its last, none half in.
            assert_eq!(seqs, (1..=last).collect::<Vec<_>>(), "backup {i}");
            copy.close().await;
        }
        stop.store(true, Ordering::SeqCst);
        writer.await.unwrap();
        assert!(written_meanwhile > 0, "no write landed while a backup ran");
    }

    #[tokio::test]
    async fn a_backup_never_overwrites_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let pool = super::super::connect(None, dir.path()).await.unwrap();
        let to = dir.path().join("kept.db");
        std::fs::write(&to, "an earlier backup").unwrap();
        let err = backup(&pool, &to).await.unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{} already exists: a backup never overwrites a file; name another",
                to.display()
            )
        );
        assert_eq!(std::fs::read_to_string(&to).unwrap(), "an earlier backup");
    }

    #[test]
    fn the_data_folder_is_held_by_one_at_a_time_until_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let held = DataLock::take(dir.path()).unwrap();
        let err = DataLock::take(dir.path()).unwrap_err();
        assert!(
            matches!(err, LockError::Held { holder: Some(pid), .. } if pid == std::process::id()),
            "{err:?}"
        );
        drop(held);
        DataLock::take(dir.path()).expect("free once let go");
    }

    /// A data folder with workers `a` and `b`, and its backup.
    async fn backed_up() -> (tempfile::TempDir, SqlitePool, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let pool = super::super::connect(None, &dir.path().join("data"))
            .await
            .unwrap();
        add_worker(&pool, "a", 10).await;
        add_worker(&pool, "b", 10).await;
        let copy = dir.path().join("backup.db");
        backup(&pool, &copy).await.unwrap();
        (dir, pool, copy)
    }

    #[tokio::test]
    async fn a_restore_while_a_server_holds_the_data_folder_is_refused() {
        let (dir, pool, copy) = backed_up().await;
        let data = dir.path().join("data");
        let _server = DataLock::take(&data).unwrap();
        let err = restore(&copy, None, &data, Installation::Here)
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "a Tessera server (pid {}) runs on the data folder {} (it holds tessera.lock), or a restore is under way: stop it first (systemctl stop tessera)",
                std::process::id(),
                data.display()
            )
        );
        add_worker(&pool, "c", 10).await;
        assert_eq!(names(&pool).await, ["a", "b", "c"]);
    }

    #[tokio::test]
    async fn a_restore_of_what_is_not_a_tessera_database_is_refused_and_changes_nothing() {
        let (dir, pool, _) = backed_up().await;
        pool.close().await;
        let data = dir.path().join("data");
        let text = dir.path().join("notes.txt");
        std::fs::write(
            &text,
            "not a database, though long enough to look like one ".repeat(20),
        )
        .unwrap();
        let err = restore(&text, None, &data, Installation::Here)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("{} is not an SQLite database: ", text.display())),
            "{err}"
        );
        let other = dir.path().join("other.db");
        let foreign = SqlitePoolOptions::new()
            .connect_with(
                SqliteConnectOptions::new()
                    .filename(&other)
                    .create_if_missing(true),
            )
            .await
            .unwrap();
        sqlx::query("CREATE TABLE notes (body TEXT)")
            .execute(&foreign)
            .await
            .unwrap();
        foreign.close().await;
        let err = restore(&other, None, &data, Installation::Here)
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "{} is not a Tessera database: it has no table of migrations",
                other.display()
            )
        );
        let newer = dir.path().join("newer.db");
        let pool = super::super::connect(None, &data).await.unwrap();
        backup(&pool, &newer).await.unwrap();
        let later = SqlitePoolOptions::new()
            .connect_with(SqliteConnectOptions::new().filename(&newer))
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (9999, 'from the future', 1, x'00', 0)",
        )
        .execute(&later)
        .await
        .unwrap();
        later.close().await;
        pool.close().await;
        let err = restore(&newer, None, &data, Installation::Here)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.ends_with("its migration 9999 is not one this Tessera knows (a newer Tessera's backup? restore it with that one)"),
            "{err}"
        );
        let pool = super::super::connect(None, &data).await.unwrap();
        assert_eq!(names(&pool).await, ["a", "b"]);
    }

    #[tokio::test]
    async fn a_restore_brings_the_backup_s_rows_back_in_place_of_the_database() {
        let (dir, pool, copy) = backed_up().await;
        add_worker(&pool, "c", 10).await;
        sqlx::query("DELETE FROM workers WHERE name = 'a'")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        let data = dir.path().join("data");
        let restored = restore(&copy, None, &data, Installation::Here)
            .await
            .unwrap();
        let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap();
        assert_eq!(
            restored,
            Restored {
                database: data.join("tessera.db"),
                version: latest,
                latest,
            }
        );
        assert!(!data.join("tessera.db-restoring").exists());
        let pool = super::super::connect(None, &data).await.unwrap();
        assert_eq!(names(&pool).await, ["a", "b"]);
        // The backup itself is left as it was, to restore again.
        assert_eq!(names(&read_only(&copy).await).await, ["a", "b"]);
    }

    async fn identity(pool: &SqlitePool) -> Vec<String> {
        sqlx::query_scalar("SELECT token FROM instance")
            .fetch_all(pool)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_restored_backup_takes_the_identity_of_the_database_it_replaces_or_with_same_installation_its_own(
    ) {
        let (dir, pool, _) = backed_up().await;
        sqlx::query(
            "INSERT INTO instance (id, token, home) VALUES (1, 'live', 'm1 /live/tessera.db')",
        )
        .execute(&pool)
        .await
        .unwrap();
        let copy = dir.path().join("with-identity.db");
        backup(&pool, &copy).await.unwrap();
        pool.close().await;
        // A fresh staging server: a new installation, made at its first start.
        let staging = dir.path().join("staging");
        restore(&copy, None, &staging, Installation::Here)
            .await
            .unwrap();
        let pool = super::super::connect(None, &staging).await.unwrap();
        assert!(identity(&pool).await.is_empty(), "a new installation");
        assert_eq!(names(&pool).await, ["a", "b"]);
        sqlx::query("INSERT INTO instance (id, token, home) VALUES (1, 'staging', 'm2 /staging/tessera.db')")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        // Restored again over it: the staging server's own identity stays.
        restore(&copy, None, &staging, Installation::Here)
            .await
            .unwrap();
        let pool = super::super::connect(None, &staging).await.unwrap();
        assert_eq!(identity(&pool).await, ["staging"]);
        pool.close().await;
        // A machine that replaces the live one: the backup's identity, taken here at the next start.
        restore(&copy, None, &staging, Installation::Backed)
            .await
            .unwrap();
        let pool = super::super::connect(None, &staging).await.unwrap();
        assert_eq!(identity(&pool).await, ["live"]);
        let home: Option<String> = sqlx::query_scalar("SELECT home FROM instance")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(home, None);
    }

    #[tokio::test]
    async fn a_restore_run_as_root_leaves_the_server_its_own_files() {
        use std::os::unix::fs::{chown, MetadataExt};
        let (dir, pool, copy) = backed_up().await;
        pool.close().await;
        if std::fs::metadata(&copy).unwrap().uid() != 0 {
            return; // Only root can give a file away.
        }
        let data = dir.path().join("data");
        for file in [data.clone(), data.join("tessera.db")] {
            chown(&file, Some(4242), Some(4243)).unwrap();
        }
        restore(&copy, None, &data, Installation::Here)
            .await
            .unwrap();
        for file in ["tessera.db", "tessera.lock"] {
            let meta = std::fs::metadata(data.join(file)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (4242, 4243), "{file}");
        }
    }
}
