-- Workers as the API accepted them, and where each runs or why it waits.
-- The scheduler's state in memory is rebuilt from this table at every start.
CREATE TABLE workers (
    -- Arrival order: pending workers are placed oldest first.
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    name            TEXT    NOT NULL,
    -- requested_resources exactly as accepted (JSON), so a restart re-reads the same request.
    request         TEXT    NOT NULL,
    command         TEXT,
    env             TEXT    NOT NULL DEFAULT '{}',
    state           TEXT    NOT NULL CHECK (state IN ('placed', 'pending')),
    -- placement::Assignment (JSON) when placed.
    assignment      TEXT,
    -- One sentence per GPU or machine (JSON array) when pending.
    pending_reasons TEXT    NOT NULL DEFAULT '[]',
    revision        INTEGER NOT NULL DEFAULT 1,
    created_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    CONSTRAINT workers_name_unique UNIQUE (name),
    CHECK ((state = 'placed') = (assignment IS NOT NULL))
);
