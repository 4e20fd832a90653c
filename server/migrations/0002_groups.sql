-- The model catalog, and the sharing groups with their committed share plans.
CREATE TABLE models (
    name          TEXT    PRIMARY KEY,
    engine        TEXT    NOT NULL CHECK (engine IN ('vllm', 'sglang', 'llamacpp', 'command')),
    -- Basis points of one GPU's memory: 10000 is 100 %.
    default_share INTEGER NOT NULL CHECK (default_share BETWEEN 1 AND 10000),
    -- The sharing group the recipe names, if any.
    group_name    TEXT,
    model_path    TEXT    NOT NULL DEFAULT '',
    -- The semantic router: shown in every plan, never edited, moves into a new group.
    system        INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE groups (
    name     TEXT    PRIMARY KEY,
    -- The GPUs the group runs on: a JSON array of {"machine", "index"}.
    gpus     TEXT    NOT NULL,
    -- Bumped at every committed plan change; a write naming another revision is refused.
    revision INTEGER NOT NULL DEFAULT 1
);

CREATE TABLE group_members (
    group_name TEXT    NOT NULL REFERENCES groups (name) ON DELETE CASCADE,
    model      TEXT    NOT NULL REFERENCES models (name),
    share      INTEGER NOT NULL CHECK (share BETWEEN 1 AND 10000),
    position   INTEGER NOT NULL,
    PRIMARY KEY (group_name, model),
    -- A model runs in one group at a time.
    CONSTRAINT group_members_model_unique UNIQUE (model)
);
