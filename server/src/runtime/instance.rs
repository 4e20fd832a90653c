//! This installation's identity: the token every engine it starts carries (a local engine in its
//! environment, a Ray job in its metadata), by which a server finds its own engines after a restart and
//! tells them from anything else that runs. It lives in the database, with where that database was last
//! opened (its home: the machine and the file): a copy opened elsewhere (a backup restored on a staging
//! server, a data folder copied to another machine or folder) is a new installation, which neither adopts
//! nor stops the engines of the one it was copied from.

use sqlx::SqlitePool;
use std::path::Path;

/// Where a database is opened: this machine (its machine id, else its host name) and the database's file.
pub fn home(database: &Path) -> String {
    let machine = [
        "/etc/machine-id",
        "/var/lib/dbus/machine-id",
        "/proc/sys/kernel/hostname",
    ]
    .iter()
    .find_map(|path| {
        let id = std::fs::read_to_string(path).ok()?;
        let id = id.trim();
        (!id.is_empty()).then(|| id.to_owned())
    })
    .unwrap_or_default();
    let file = std::path::absolute(database).unwrap_or_else(|_| database.to_path_buf());
    let file = file.canonicalize().unwrap_or(file);
    format!("{machine} {}", file.display())
}

/// What a server knows of its identity when it opens the database.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    /// Where the database is opened now ([`home`]); none where it has no file of its own (in memory).
    pub home: Option<String>,
    /// This machine and folder replace those the database was last opened at: keep the identity.
    pub same_installation: bool,
}

/// A token no other installation has.
fn fresh() -> String {
    format!(
        "{:x}-{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
        std::process::id()
    )
}

/// This installation's token: the one the database keeps, unless it was last opened somewhere else (and
/// `identity` does not say this place replaces that one), when a new one is made and kept, and said so.
/// A database from before homes were kept is taken as opened here: an upgrade keeps its engines.
pub async fn token(pool: &SqlitePool, identity: &Identity) -> Result<String, sqlx::Error> {
    let kept: Option<(String, Option<String>)> =
        sqlx::query_as("SELECT token, home FROM instance WHERE id = 1")
            .fetch_optional(pool)
            .await?;
    let token = match kept {
        Some((_, Some(was)))
            if identity.home.as_ref().is_some_and(|now| *now != was)
                && !identity.same_installation =>
        {
            tracing::warn!(
                "this database was last opened at {was}, not here: a copy is a new installation, which neither adopts nor stops the engines that one runs; start with --same-installation where this machine and folder replace it"
            );
            fresh()
        }
        Some((token, _)) => token,
        None => fresh(),
    };
    sqlx::query(
        "INSERT INTO instance (id, token, home) VALUES (1, ?1, ?2)
         ON CONFLICT (id) DO UPDATE SET token = ?1, home = coalesce(?2, home)",
    )
    .bind(&token)
    .bind(identity.home.as_deref())
    .execute(pool)
    .await?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pool() -> SqlitePool {
        let pool = SqlitePool::connect("sqlite::memory:").await.unwrap();
        crate::db::MIGRATOR.run(&pool).await.unwrap();
        pool
    }

    fn at(home: &str) -> Identity {
        Identity {
            home: Some(home.to_owned()),
            same_installation: false,
        }
    }

    #[tokio::test]
    async fn a_database_opened_where_it_was_keeps_its_token_and_opened_elsewhere_gets_a_new_one() {
        let pool = pool().await;
        let first = token(&pool, &at("m1 /var/lib/tessera/tessera.db"))
            .await
            .unwrap();
        let again = token(&pool, &at("m1 /var/lib/tessera/tessera.db"))
            .await
            .unwrap();
        assert_eq!(first, again);
        let copied = token(&pool, &at("m2 /var/lib/tessera/tessera.db"))
            .await
            .unwrap();
        assert_ne!(
            copied, first,
            "a copy on another machine is a new installation"
        );
        let moved = token(&pool, &at("m2 /srv/tessera/tessera.db"))
            .await
            .unwrap();
        assert_ne!(
            moved, copied,
            "a copy in another folder is a new installation"
        );
        assert_eq!(
            token(&pool, &at("m2 /srv/tessera/tessera.db"))
                .await
                .unwrap(),
            moved,
            "and keeps its new token from then on"
        );
    }

    #[tokio::test]
    async fn a_database_moved_with_same_installation_keeps_its_token() {
        let pool = pool().await;
        let first = token(&pool, &at("m1 /var/lib/tessera/tessera.db"))
            .await
            .unwrap();
        let moved = Identity {
            same_installation: true,
            ..at("m2 /var/lib/tessera/tessera.db")
        };
        assert_eq!(token(&pool, &moved).await.unwrap(), first);
        // Its new home is kept: opened there again, it needs no flag.
        let again = token(&pool, &at("m2 /var/lib/tessera/tessera.db"))
            .await
            .unwrap();
        assert_eq!(again, first);
    }

    #[tokio::test]
    async fn a_database_from_before_homes_were_kept_keeps_its_token_at_its_first_open() {
        let pool = pool().await;
        sqlx::query("INSERT INTO instance (id, token) VALUES (1, 'old')")
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(
            token(&pool, &at("m1 /data/tessera.db")).await.unwrap(),
            "old"
        );
        assert_eq!(
            token(&pool, &at("m1 /data/tessera.db")).await.unwrap(),
            "old"
        );
    }
}
