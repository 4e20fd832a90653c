-- The runtime: what each engine process was started as, so that a server started again after a crash
-- adopts the engines that still run (same PID *and* same start time) and stops the rest.

-- One row: this data folder's instance, carried by every engine in its environment so that engines of
-- this installation are told apart from everything else on the machine.
CREATE TABLE instance (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    token TEXT    NOT NULL
);

CREATE TABLE engines (
    -- The scheduler's holder name: a worker's name, or group:{group}/{model}@{machine}.
    unit        TEXT    PRIMARY KEY,
    -- What it was started as (program, arguments, environment, share); a different desired spec restarts it.
    fingerprint TEXT    NOT NULL,
    pid         INTEGER NOT NULL,
    -- The process's start time in clock ticks since boot (/proc/PID/stat field 22): a reused PID has another.
    start_ticks INTEGER NOT NULL,
    port        INTEGER NOT NULL,
    started_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

-- Engine recipes: extra arguments (a JSON array) and environment (a JSON object) for every deployment of
-- the model, and the command template of a `command` engine.
ALTER TABLE models ADD COLUMN command TEXT;
ALTER TABLE models ADD COLUMN args TEXT NOT NULL DEFAULT '[]';
ALTER TABLE models ADD COLUMN env TEXT NOT NULL DEFAULT '{}';

-- A deployment's own serving configuration, added to its model's recipe.
ALTER TABLE group_members ADD COLUMN args TEXT NOT NULL DEFAULT '[]';
ALTER TABLE group_members ADD COLUMN env TEXT NOT NULL DEFAULT '{}';
