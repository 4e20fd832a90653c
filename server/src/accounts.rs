//! Accounts: people with a role and a password (argon2id), and API tokens for scripts. A token is shown
//! once, when it is made, and stored only as its SHA-256 digest; it acts with its owner's role.

use crate::audit::{self, Entry};
use crate::error::ApiError;
use app::auth::{Caller, Role};
use app::views::{Account, ApiToken, NewApiToken};
use argon2::password_hash::rand_core::{OsRng, RngCore};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlx::SqlitePool;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest password accepted.
pub const MIN_PASSWORD_LEN: usize = 12;
/// The longest: argon2 takes any length, but a megabyte of "password" is an attack on the CPU.
pub const MAX_PASSWORD_LEN: usize = 1024;
/// What every API token starts with, so that a leaked one is easy to recognise and search for.
pub const TOKEN_PREFIX: &str = "tsr_";

/// `POST /api/users`, and `tessera user add`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    /// Letters, digits, `.`, `-`, `_`, at most 63.
    pub name: String,
    /// `admin`, `operator` or `viewer`.
    pub role: Role,
    /// At least 12 characters.
    pub password: String,
}

/// `POST /api/tokens`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// What it is for, such as `ci`.
    pub name: String,
    /// Whose role it acts with; the caller's own account when absent.
    #[serde(default)]
    pub user: Option<String>,
}

/// The argon2id hash of `password`, in PHC form.
pub fn hash_password(password: &str) -> Result<String, ApiError> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(ApiError::internal)
}

/// [`hash_password`] on a blocking thread: argon2 takes tens of milliseconds of CPU, which would stall
/// every request served by the same async thread.
async fn hash_off_executor(password: &str) -> Result<String, ApiError> {
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(ApiError::internal)?
}

/// Whether `password` matches `hash`.
pub fn verify_password(hash: &str, password: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|parsed| {
        Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

fn check_password(password: &str) -> Result<(), ApiError> {
    let len = password.chars().count();
    if !(MIN_PASSWORD_LEN..=MAX_PASSWORD_LEN).contains(&len) {
        return Err(ApiError::Unprocessable(format!(
            "a password needs {MIN_PASSWORD_LEN} to {MAX_PASSWORD_LEN} characters; this one has {len}"
        )));
    }
    Ok(())
}

/// Bytes as lower-case hex. (Every API request digests its token: no allocation per byte.)
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// A token's SHA-256 digest, as the cache keeps it.
type Digest32 = [u8; 32];

fn token_key(secret: &str) -> Digest32 {
    Sha256::digest(secret.as_bytes()).into()
}

fn token_digest(secret: &str) -> String {
    hex(&token_key(secret))
}

/// `count` random bytes from the operating system, as hex.
pub(crate) fn random_hex(count: usize) -> String {
    let mut bytes = vec![0u8; count];
    OsRng.fill_bytes(&mut bytes);
    hex(&bytes)
}

fn new_secret() -> String {
    format!("{TOKEN_PREFIX}{}", random_hex(32))
}

fn role_of(text: &str) -> Result<Role, ApiError> {
    Role::parse(text).ok_or_else(|| ApiError::internal(format!("stored role {text:?}")))
}

/// How many accounts there are: none before the first admin is made.
pub async fn count(pool: &SqlitePool) -> Result<i64, ApiError> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM users")
        .fetch_one(pool)
        .await?)
}

/// Makes an account, recorded in the audit log as `actor`'s doing.
pub async fn create_user(
    pool: &SqlitePool,
    new: &NewUser,
    actor: &str,
) -> Result<Account, ApiError> {
    crate::fleet::check_name(&new.name)?;
    check_password(&new.password)?;
    let hash = hash_off_executor(&new.password).await?;
    let mut tx = crate::db::write(pool).await?;
    sqlx::query("INSERT INTO users (name, password_hash, role) VALUES (?, ?, ?)")
        .bind(&new.name)
        .bind(&hash)
        .bind(new.role.as_str())
        .execute(&mut *tx)
        .await
        .map_err(|e| {
            ApiError::on_unique(e, || {
                format!("an account named {} exists already", new.name)
            })
        })?;
    audit::record(
        &mut tx,
        Entry::new(actor, "user.create", &new.name).after(serde_json::json!({ "role": new.role })),
    )
    .await?;
    tx.commit().await?;
    user(pool, &new.name).await
}

/// Makes the first admin, but only while there is no account at all (the setup page's one job); answers
/// its id. Anyone may ask, so whether an account exists is checked before the password is hashed.
pub async fn create_first_admin(
    pool: &SqlitePool,
    name: &str,
    password: &str,
) -> Result<(i64, Account), ApiError> {
    let taken = || ApiError::Conflict("Tessera has an admin already: sign in instead".to_owned());
    if count(pool).await? > 0 {
        return Err(taken());
    }
    crate::fleet::check_name(name)?;
    check_password(password)?;
    let hash = hash_off_executor(password).await?;
    let mut tx = crate::db::write(pool).await?;
    // Checked again in the write: two setups at once make one admin.
    let made: Option<i64> = sqlx::query_scalar(
        "INSERT INTO users (name, password_hash, role) SELECT ?, ?, 'admin' WHERE NOT EXISTS (SELECT 1 FROM users) RETURNING id",
    )
    .bind(name)
    .bind(&hash)
    .fetch_optional(&mut *tx)
    .await?;
    let id = made.ok_or_else(taken)?;
    audit::record(
        &mut tx,
        Entry::new(name, "user.create", name).after(serde_json::json!({ "role": "admin" })),
    )
    .await?;
    tx.commit().await?;
    Ok((id, user(pool, name).await?))
}

/// One account.
pub async fn user(pool: &SqlitePool, name: &str) -> Result<Account, ApiError> {
    let row: Option<(String, String, String)> =
        sqlx::query_as("SELECT name, role, created_at FROM users WHERE name = ?")
            .bind(name)
            .fetch_optional(pool)
            .await?;
    let (name, role, created_at) =
        row.ok_or_else(|| ApiError::NotFound(format!("there is no account named {name}")))?;
    Ok(Account {
        role: role_of(&role)?,
        name,
        created_at,
    })
}

/// Every account, by name.
pub async fn users(pool: &SqlitePool) -> Result<Vec<Account>, ApiError> {
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT name, role, created_at FROM users ORDER BY name")
            .fetch_all(pool)
            .await?;
    rows.into_iter()
        .map(|(name, role, created_at)| {
            Ok(Account {
                role: role_of(&role)?,
                name,
                created_at,
            })
        })
        .collect()
}

/// Removes an account and its tokens; the last admin stays, so that someone can still manage accounts, and
/// no one removes their own account, which would end the session (or the script) that asked.
pub async fn delete_user(pool: &SqlitePool, name: &str, actor: &str) -> Result<(), ApiError> {
    if name == actor {
        return Err(ApiError::Conflict(format!(
            "{name} is your own account; another admin can remove it"
        )));
    }
    let mut tx = crate::db::write(pool).await?;
    let role: Option<String> = sqlx::query_scalar("SELECT role FROM users WHERE name = ?")
        .bind(name)
        .fetch_optional(&mut *tx)
        .await?;
    let role =
        role.ok_or_else(|| ApiError::NotFound(format!("there is no account named {name}")))?;
    if role == "admin" {
        let admins: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM users WHERE role = 'admin'")
            .fetch_one(&mut *tx)
            .await?;
        if admins == 1 {
            return Err(ApiError::Conflict(format!(
                "{name} is the last admin; make another admin first"
            )));
        }
    }
    sqlx::query("DELETE FROM users WHERE name = ?")
        .bind(name)
        .execute(&mut *tx)
        .await?;
    audit::record(
        &mut tx,
        Entry::new(actor, "user.delete", name).before(serde_json::json!({ "role": role })),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// A stand-in hash that an unknown name is checked against, so that an unknown name takes as long to
/// refuse as a wrong password.
fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| hash_password("not anyone's password").unwrap_or_default())
}

/// The account `name` if `password` is its password.
pub async fn authenticate(
    pool: &SqlitePool,
    name: &str,
    password: &str,
) -> Result<Option<(i64, Caller)>, ApiError> {
    if password.len() > MAX_PASSWORD_LEN * 4 {
        return Ok(None);
    }
    let row: Option<(i64, String, String)> =
        sqlx::query_as("SELECT id, password_hash, role FROM users WHERE name = ?")
            .bind(name)
            .fetch_optional(pool)
            .await?;
    let password = password.to_owned();
    let stored = row.as_ref().map(|(_, hash, _)| hash.clone());
    let known = stored.is_some();
    // argon2 takes tens of milliseconds of CPU (the decoy's first hash too): off the async threads.
    let matches = tokio::task::spawn_blocking(move || {
        verify_password(stored.as_deref().unwrap_or_else(|| decoy_hash()), &password)
    })
    .await
    .map_err(ApiError::internal)?;
    match row {
        Some((id, _, role)) if matches && known => Ok(Some((
            id,
            Caller {
                name: name.to_owned(),
                role: role_of(&role)?,
            },
        ))),
        _ => Ok(None),
    }
}

/// The account behind a session's user id, if it still exists (with its role of now).
pub async fn caller_by_id(pool: &SqlitePool, id: i64) -> Result<Option<Caller>, ApiError> {
    let row: Option<(String, String)> = sqlx::query_as("SELECT name, role FROM users WHERE id = ?")
        .bind(id)
        .fetch_optional(pool)
        .await?;
    row.map(|(name, role)| {
        Ok(Caller {
            name,
            role: role_of(&role)?,
        })
    })
    .transpose()
}

/// How long a token's owner is remembered between lookups, and how often its last use is written. A token
/// revoked through this server stops at once; one revoked by `tessera` from another process within this.
const TOKEN_MEMORY: Duration = Duration::from_secs(30);

/// Recently seen tokens, so that a script's every request does not read (and write) the database.
#[derive(Debug, Default)]
pub struct TokenCache {
    seen: Mutex<HashMap<Digest32, (Caller, Instant)>>,
}

impl TokenCache {
    fn get(&self, digest: &Digest32, now: Instant) -> Option<Caller> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(digest)
            .filter(|(_, at)| now.duration_since(*at) < TOKEN_MEMORY)
            .map(|(caller, _)| caller.clone())
    }

    fn put(&self, digest: Digest32, caller: Caller, now: Instant) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.retain(|_, (_, at)| now.duration_since(*at) < TOKEN_MEMORY);
        seen.insert(digest, (caller, now));
    }

    /// Forgets every token: after a revocation or an account's removal.
    pub fn forget(&self) {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

fn is_token_shaped(secret: &str) -> bool {
    secret.starts_with(TOKEN_PREFIX) && secret.len() <= 128
}

/// The account an API token acts for if it was looked up lately (without waiting on the database): the
/// read path's way through the guard.
pub(crate) fn cached_caller(cache: &TokenCache, secret: &str) -> Option<Caller> {
    is_token_shaped(secret)
        .then(|| cache.get(&token_key(secret), Instant::now()))
        .flatten()
}

/// The account an API token acts for, if the token is one and is not revoked; its last use is noted.
pub async fn caller_by_token(
    pool: &SqlitePool,
    cache: &TokenCache,
    secret: &str,
) -> Result<Option<Caller>, ApiError> {
    if !is_token_shaped(secret) {
        return Ok(None);
    }
    let key = token_key(secret);
    let now = Instant::now();
    if let Some(caller) = cache.get(&key, now) {
        return Ok(Some(caller));
    }
    let digest = hex(&key);
    let row: Option<(i64, String, String)> = sqlx::query_as(
        "SELECT t.id, u.name, u.role FROM api_tokens t JOIN users u ON u.id = t.user_id \
         WHERE t.hash = ? AND t.revoked_at IS NULL",
    )
    .bind(&digest)
    .fetch_optional(pool)
    .await?;
    let Some((id, name, role)) = row else {
        return Ok(None);
    };
    sqlx::query(
        "UPDATE api_tokens SET last_used_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ?",
    )
    .bind(id)
    .execute(pool)
    .await?;
    let caller = Caller {
        name,
        role: role_of(&role)?,
    };
    cache.put(key, caller.clone(), now);
    Ok(Some(caller))
}

/// Makes an API token for `user`; its secret is in the answer and nowhere else.
pub async fn create_token(
    pool: &SqlitePool,
    user: &str,
    name: &str,
    actor: &str,
) -> Result<NewApiToken, ApiError> {
    crate::fleet::check_name(name)?;
    let secret = new_secret();
    let prefix: String = secret.chars().take(TOKEN_PREFIX.len() + 6).collect();
    let mut tx = crate::db::write(pool).await?;
    let user_id: Option<i64> = sqlx::query_scalar("SELECT id FROM users WHERE name = ?")
        .bind(user)
        .fetch_optional(&mut *tx)
        .await?;
    let user_id =
        user_id.ok_or_else(|| ApiError::NotFound(format!("there is no account named {user}")))?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO api_tokens (user_id, name, hash, prefix) VALUES (?, ?, ?, ?) RETURNING id",
    )
    .bind(user_id)
    .bind(name)
    .bind(token_digest(&secret))
    .bind(&prefix)
    .fetch_one(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        Entry::new(actor, "token.create", &format!("{user}/{name}"))
            .after(serde_json::json!({ "id": id, "prefix": prefix })),
    )
    .await?;
    tx.commit().await?;
    let token = tokens(pool)
        .await?
        .into_iter()
        .find(|t| t.id == id)
        .ok_or_else(|| ApiError::internal("a token just made is gone"))?;
    Ok(NewApiToken { token, secret })
}

/// Every API token, newest first.
pub async fn tokens(pool: &SqlitePool) -> Result<Vec<ApiToken>, ApiError> {
    type Row = (
        i64,
        String,
        String,
        String,
        String,
        Option<String>,
        Option<String>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT t.id, t.name, u.name, t.prefix, t.created_at, t.last_used_at, t.revoked_at \
         FROM api_tokens t JOIN users u ON u.id = t.user_id ORDER BY t.id DESC",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, name, user, prefix, created_at, last_used_at, revoked_at)| ApiToken {
                id,
                name,
                user,
                prefix,
                created_at,
                last_used_at,
                revoked_at,
            },
        )
        .collect())
}

/// Revokes a token: it stops working at once, and stays listed as revoked.
pub async fn revoke_token(pool: &SqlitePool, id: i64, actor: &str) -> Result<ApiToken, ApiError> {
    let mut tx = crate::db::write(pool).await?;
    let revoked = sqlx::query(
        "UPDATE api_tokens SET revoked_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ? AND revoked_at IS NULL",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?;
    if revoked.rows_affected() == 0 {
        return Err(ApiError::NotFound(format!(
            "there is no token {id} that works; GET /api/tokens lists them"
        )));
    }
    audit::record(&mut tx, Entry::new(actor, "token.revoke", &id.to_string())).await?;
    tx.commit().await?;
    tokens(pool)
        .await?
        .into_iter()
        .find(|t| t.id == id)
        .ok_or_else(|| ApiError::internal("a token just revoked is gone"))
}

#[cfg(test)]
mod tests;
