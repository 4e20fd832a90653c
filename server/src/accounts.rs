//! Accounts: people with a role and a password (argon2id), and API tokens for scripts. A token is shown
//! once, when it is made, and stored only as its SHA-256 digest; it acts with its owner's role.

use crate::audit::{self, Entry};
use crate::error::ApiError;
use crate::input::{NewToken, NewUser, MAX_PASSWORD_LEN};
use app::auth::{Caller, Role};
use app::views::{Account, ApiToken, NewApiToken, TokenLimits, TokenScope};
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use sha2::{Digest, Sha256};
use sqlx::SqlitePool;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What every API token starts with, so that a leaked one is easy to recognise and search for.
pub const TOKEN_PREFIX: &str = "tsr_";

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

pub(crate) use crate::random::{hex, random_hex};

/// A token's SHA-256 digest, as the cache keeps it.
type Digest32 = [u8; 32];

fn token_key(secret: &str) -> Digest32 {
    Sha256::digest(secret.as_bytes()).into()
}

fn token_digest(secret: &str) -> String {
    hex(&token_key(secret))
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
    let hash = hash_off_executor(new.password()).await?;
    let mut tx = crate::db::write(pool).await?;
    sqlx::query("INSERT INTO users (name, password_hash, role) VALUES (?, ?, ?)")
        .bind(new.name())
        .bind(&hash)
        .bind(new.role().as_str())
        .execute(&mut *tx)
        .await
        .map_err(|e| {
            ApiError::on_unique(e, || {
                format!("an account named {} exists already", new.name())
            })
        })?;
    audit::record(
        &mut tx,
        Entry::new(actor, "user.create", new.name())
            .after(serde_json::json!({ "role": new.role() })),
    )
    .await?;
    tx.commit().await?;
    user(pool, new.name()).await
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
    // Parsed here rather than at the edge: one who asks once an admin exists is told so, whatever they sent.
    let new = NewUser::parse(name.to_owned(), Role::Admin, password.to_owned())?;
    let hash = hash_off_executor(new.password()).await?;
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

/// What a token that works lets its holder do.
#[derive(Debug, Clone)]
pub struct Grant {
    /// How the gateway's figures name it: made once per lookup, not once per request.
    pub key: crate::fleet::calls::Key,
    /// Its owner, whose role it acts with.
    pub caller: Caller,
    /// What it may call.
    pub scope: TokenScope,
    /// The models it may call through the gateway; every model when `None`.
    pub models: Option<Vec<String>>,
    /// When it stops working, on this process's clock.
    until: Option<Instant>,
}

/// Whether a key limited to `models` (every model when `None`) may call `model` through the gateway.
pub fn may_call(models: Option<&[String]>, model: &str) -> bool {
    models.is_none_or(|models| models.iter().any(|m| m == model))
}

impl Grant {
    /// Whether it may call `model` through the gateway.
    pub fn may_call(&self, model: &str) -> bool {
        may_call(self.models.as_deref(), model)
    }

    fn works_at(&self, now: Instant) -> bool {
        self.until.is_none_or(|until| now < until)
    }
}

/// Why a token does not work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It is not a token, is unknown or revoked.
    Unknown,
    /// It expired at that time.
    Expired(String),
}

impl Refusal {
    /// What the caller is told.
    pub fn message(&self) -> String {
        match self {
            Refusal::Unknown => {
                "that API token is unknown or revoked; an admin can make another (POST /api/tokens)"
                    .to_owned()
            }
            Refusal::Expired(at) => format!(
                "that API token expired at {at}; an admin can make another (POST /api/tokens)"
            ),
        }
    }
}

/// Recently seen tokens, so that a script's every request does not read (and write) the database.
#[derive(Debug, Default)]
pub struct TokenCache {
    seen: Mutex<HashMap<Digest32, (Grant, Instant)>>,
}

impl TokenCache {
    fn get(&self, digest: &Digest32, now: Instant) -> Option<Grant> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(digest)
            .filter(|(grant, at)| now.duration_since(*at) < TOKEN_MEMORY && grant.works_at(now))
            .map(|(grant, _)| grant.clone())
    }

    fn put(&self, digest: Digest32, grant: Grant, now: Instant) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.retain(|_, (_, at)| now.duration_since(*at) < TOKEN_MEMORY);
        seen.insert(digest, (grant, now));
    }

    /// Forgets every token: after a revocation or an account's removal.
    pub fn forget(&self) {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

fn is_token_shaped(secret: &str) -> bool {
    secret.starts_with(TOKEN_PREFIX) && secret.len() <= 128
}

/// What an API token grants if it was looked up lately (without waiting on the database): the read
/// path's way through the guard and the gateway.
pub(crate) fn cached_grant(cache: &TokenCache, secret: &str) -> Option<Grant> {
    is_token_shaped(secret)
        .then(|| cache.get(&token_key(secret), Instant::now()))
        .flatten()
}

/// What an API token grants, if it is one, is not revoked and has not expired; its last use is noted.
pub async fn grant_by_token(
    pool: &SqlitePool,
    cache: &TokenCache,
    secret: &str,
) -> Result<Result<Grant, Refusal>, ApiError> {
    if !is_token_shaped(secret) {
        return Ok(Err(Refusal::Unknown));
    }
    let key = token_key(secret);
    let now = Instant::now();
    if let Some(grant) = cache.get(&key, now) {
        return Ok(Ok(grant));
    }
    let digest = hex(&key);
    type Row = (
        i64,
        String,
        String,
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        Option<i64>,
    );
    // The time left is SQLite's to work out: it compares the stored time with its own clock.
    let row: Option<Row> = sqlx::query_as(
        "SELECT t.id, t.prefix, t.name, u.name, u.role, t.scope, t.models, t.expires_at, \
                CAST((julianday(t.expires_at) - julianday('now')) * 86400000 AS INTEGER) \
         FROM api_tokens t JOIN users u ON u.id = t.user_id \
         WHERE t.hash = ? AND t.revoked_at IS NULL",
    )
    .bind(&digest)
    .fetch_optional(pool)
    .await?;
    let Some((id, prefix, token_name, name, role, scope, models, expires_at, left_ms)) = row else {
        return Ok(Err(Refusal::Unknown));
    };
    let until = match (expires_at, left_ms) {
        (Some(at), Some(left)) if left <= 0 => return Ok(Err(Refusal::Expired(at))),
        (_, Some(left)) => Some(now + Duration::from_millis(left as u64)),
        _ => None,
    };
    sqlx::query(
        "UPDATE api_tokens SET last_used_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ?",
    )
    .bind(id)
    .execute(pool)
    .await?;
    let grant = Grant {
        key: crate::fleet::calls::Key::token(&name, &token_name, &prefix),
        caller: Caller {
            name,
            role: role_of(&role)?,
        },
        scope: scope_of(&scope)?,
        models: models_of(models.as_deref())?,
        until,
    };
    cache.put(key, grant.clone(), now);
    Ok(Ok(grant))
}

fn scope_of(text: &str) -> Result<TokenScope, ApiError> {
    match text {
        "api" => Ok(TokenScope::Api),
        "inference" => Ok(TokenScope::Inference),
        _ => Err(ApiError::internal(format!("stored token scope {text:?}"))),
    }
}

fn models_of(json: Option<&str>) -> Result<Option<Vec<String>>, ApiError> {
    json.map(serde_json::from_str)
        .transpose()
        .map_err(ApiError::internal)
}

/// Makes an API token for `user`; its secret is in the answer and nowhere else.
pub async fn create_token(
    pool: &SqlitePool,
    user: &str,
    new: &NewToken,
    actor: &str,
) -> Result<NewApiToken, ApiError> {
    let (name, limits) = (new.name(), new.limits());
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
        "INSERT INTO api_tokens (user_id, name, hash, prefix, scope, models, expires_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(user_id)
    .bind(name)
    .bind(token_digest(&secret))
    .bind(&prefix)
    .bind(limits.scope.as_str())
    .bind(
        limits
            .models
            .as_ref()
            .map(|m| serde_json::Value::from(m.clone()).to_string()),
    )
    .bind(&limits.expires_at)
    .fetch_one(&mut *tx)
    .await?;
    audit::record(
        &mut tx,
        Entry::new(actor, "token.create", &format!("{user}/{name}")).after(serde_json::json!({
            "id": id,
            "prefix": prefix,
            "scope": limits.scope,
            "models": limits.models,
            "expires_at": limits.expires_at,
        })),
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
    #[derive(sqlx::FromRow)]
    struct Row {
        id: i64,
        name: String,
        user: String,
        prefix: String,
        created_at: String,
        last_used_at: Option<String>,
        revoked_at: Option<String>,
        scope: String,
        models: Option<String>,
        expires_at: Option<String>,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT t.id, t.name, u.name AS user, t.prefix, t.created_at, t.last_used_at, t.revoked_at, \
                t.scope, t.models, t.expires_at \
         FROM api_tokens t JOIN users u ON u.id = t.user_id ORDER BY t.id DESC",
    )
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| {
            Ok(ApiToken {
                id: row.id,
                name: row.name,
                user: row.user,
                prefix: row.prefix,
                created_at: row.created_at,
                last_used_at: row.last_used_at,
                revoked_at: row.revoked_at,
                limits: TokenLimits {
                    scope: scope_of(&row.scope)?,
                    models: models_of(row.models.as_deref())?,
                    expires_at: row.expires_at,
                },
            })
        })
        .collect()
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
