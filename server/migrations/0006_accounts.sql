-- Accounts, API tokens, browser sessions and the audit log.

CREATE TABLE users (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT    NOT NULL,
    -- argon2id, in PHC form; the password itself is never stored.
    password_hash TEXT    NOT NULL,
    role          TEXT    NOT NULL CHECK (role IN ('admin', 'operator', 'viewer')),
    created_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    CONSTRAINT users_name_unique UNIQUE (name)
);

CREATE TABLE api_tokens (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id      INTEGER NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name         TEXT    NOT NULL,
    -- SHA-256 of the token, hex: the token is shown once, when it is made.
    hash         TEXT    NOT NULL,
    -- Its first characters, to tell tokens apart in a list.
    prefix       TEXT    NOT NULL,
    created_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    last_used_at TEXT,
    revoked_at   TEXT,
    CONSTRAINT api_tokens_hash_unique UNIQUE (hash)
);

-- tower-sessions' records: the session's data as JSON, and when it expires (seconds since the epoch).
CREATE TABLE sessions (
    id          TEXT    PRIMARY KEY,
    data        TEXT    NOT NULL,
    expiry_date INTEGER NOT NULL
);
CREATE INDEX sessions_expiry ON sessions (expiry_date);

CREATE TABLE audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    actor    TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    target   TEXT    NOT NULL,
    -- JSON, where the change has a before and an after.
    before   TEXT,
    after    TEXT,
    revision INTEGER,
    -- The models that restarted, a JSON array.
    restarts TEXT    NOT NULL DEFAULT '[]'
);
CREATE INDEX audit_actor ON audit (actor);
CREATE INDEX audit_target ON audit (target);
