-- Sessions are stored under the SHA-256 digest of their id from now on (auth/sessions.rs). Those stored
-- under the plain id are dropped: whoever could read this file could have signed in with them. Their
-- holders sign in again.
DELETE FROM sessions;

-- Environment variables a recipe marks secret beyond those named like one (HF_TOKEN): a JSON array.
ALTER TABLE models ADD COLUMN secret_env TEXT NOT NULL DEFAULT '[]';
