//! tower-sessions' records in our SQLite database, through the server's own pool (the crate's sqlx store
//! is built on another sqlx than ours, and two of them cannot link the same SQLite).
//!
//! A session is stored under the SHA-256 digest of its id, never the id itself: engines run as the
//! server's user, and whoever reads `tessera.db` must not find cookies there to sign in with.

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use sqlx::SqlitePool;
use time::OffsetDateTime;
use tower_sessions::session::{Id, Record};
use tower_sessions::session_store::{Error, Result};
use tower_sessions::SessionStore;

/// The `sessions` table.
#[derive(Debug, Clone)]
pub struct SqliteSessions {
    pool: SqlitePool,
}

impl SqliteSessions {
    /// Sessions in `pool`.
    pub fn new(pool: SqlitePool) -> SqliteSessions {
        SqliteSessions { pool }
    }

    /// Deletes the sessions that have expired.
    pub async fn delete_expired(&self) -> std::result::Result<u64, sqlx::Error> {
        Ok(sqlx::query("DELETE FROM sessions WHERE expiry_date < ?")
            .bind(OffsetDateTime::now_utc().unix_timestamp())
            .execute(&self.pool)
            .await?
            .rows_affected())
    }
}

/// The key a session is stored under: its id's digest.
fn key(id: &Id) -> String {
    crate::accounts::hex(&Sha256::digest(id.to_string().as_bytes()))
}

fn backend(e: sqlx::Error) -> Error {
    Error::Backend(e.to_string())
}

#[async_trait]
impl SessionStore for SqliteSessions {
    async fn create(&self, record: &mut Record) -> Result<()> {
        let data = serde_json::to_string(&record.data).map_err(|e| Error::Encode(e.to_string()))?;
        // A new id until one is free: ids are random 128-bit numbers, so this loops at most once in
        // practice.
        loop {
            let made = sqlx::query(
                "INSERT INTO sessions (id, data, expiry_date) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING",
            )
            .bind(key(&record.id))
            .bind(&data)
            .bind(record.expiry_date.unix_timestamp())
            .execute(&self.pool)
            .await
            .map_err(backend)?;
            if made.rows_affected() == 1 {
                return Ok(());
            }
            record.id = Id::default();
        }
    }

    async fn save(&self, record: &Record) -> Result<()> {
        let data = serde_json::to_string(&record.data).map_err(|e| Error::Encode(e.to_string()))?;
        sqlx::query(
            "INSERT INTO sessions (id, data, expiry_date) VALUES (?, ?, ?) \
             ON CONFLICT (id) DO UPDATE SET data = excluded.data, expiry_date = excluded.expiry_date",
        )
        .bind(key(&record.id))
        .bind(&data)
        .bind(record.expiry_date.unix_timestamp())
        .execute(&self.pool)
        .await
        .map_err(backend)?;
        Ok(())
    }

    async fn load(&self, id: &Id) -> Result<Option<Record>> {
        let row: Option<(String, i64)> = sqlx::query_as(
            "SELECT data, expiry_date FROM sessions WHERE id = ? AND expiry_date > ?",
        )
        .bind(key(id))
        .bind(OffsetDateTime::now_utc().unix_timestamp())
        .fetch_optional(&self.pool)
        .await
        .map_err(backend)?;
        row.map(|(data, expiry)| {
            Ok(Record {
                id: *id,
                data: serde_json::from_str(&data).map_err(|e| Error::Decode(e.to_string()))?,
                expiry_date: OffsetDateTime::from_unix_timestamp(expiry)
                    .map_err(|e| Error::Decode(e.to_string()))?,
            })
        })
        .transpose()
    }

    async fn delete(&self, id: &Id) -> Result<()> {
        sqlx::query("DELETE FROM sessions WHERE id = ?")
            .bind(key(id))
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(())
    }
}
