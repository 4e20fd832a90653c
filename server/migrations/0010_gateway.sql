-- The gateway (/v1): tokens limited to inference, to some models, or in time; and what it carried.

-- `api`: the whole API with the owner's role (every token so far); `inference`: only the gateway.
ALTER TABLE api_tokens ADD COLUMN scope TEXT NOT NULL DEFAULT 'api' CHECK (scope IN ('api', 'inference'));
-- For an inference token, the models it may call: a JSON array; every model when NULL.
ALTER TABLE api_tokens ADD COLUMN models TEXT;
-- When it stops working (RFC 3339, UTC); never when NULL.
ALTER TABLE api_tokens ADD COLUMN expires_at TEXT;

-- Requests through the gateway, per hour, model and key: how many, how many failed, and the tokens the
-- engines reported in their answers' `usage`. The key as the report names it (an API token's account, name
-- and first characters, or an account in the console's playground), so that it outlives the token.
CREATE TABLE gateway_calls (
    hour_ms           INTEGER NOT NULL,
    model             TEXT    NOT NULL,
    key               TEXT    NOT NULL,
    requests          INTEGER NOT NULL CHECK (requests >= 0),
    failed            INTEGER NOT NULL CHECK (failed >= 0),
    prompt_tokens     INTEGER NOT NULL CHECK (prompt_tokens >= 0),
    completion_tokens INTEGER NOT NULL CHECK (completion_tokens >= 0),
    PRIMARY KEY (hour_ms, model, key)
) WITHOUT ROWID;
