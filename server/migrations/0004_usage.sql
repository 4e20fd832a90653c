-- Usage (seed 000): every span in which a worker or a group's model held memory on a GPU, and the GPUs'
-- live readings, from which GPU-hours, use and energy are split among sharers.

CREATE TABLE holdings (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    -- The scheduler's holder name: a worker's name, or group:{group}/{model}@{machine}.
    holder          TEXT    NOT NULL,
    -- The worker's or the model's name, and the model's group.
    name            TEXT    NOT NULL,
    group_name      TEXT,
    machine         TEXT    NOT NULL,
    gpu_index       INTEGER NOT NULL,
    -- The share for shared work, the GPU's total for a whole GPU.
    held_bytes      INTEGER NOT NULL CHECK (held_bytes >= 0),
    gpu_total_bytes INTEGER NOT NULL CHECK (gpu_total_bytes > 0),
    -- Milliseconds since the epoch; an open span has no end.
    start_ms        INTEGER NOT NULL,
    end_ms          INTEGER,
    CHECK (end_ms IS NULL OR end_ms >= start_ms)
);
CREATE INDEX holdings_open ON holdings (holder) WHERE end_ms IS NULL;
CREATE INDEX holdings_start ON holdings (start_ms);

-- NVML's readings of this machine's GPUs, one row per GPU per reading.
CREATE TABLE gpu_samples (
    machine             TEXT    NOT NULL,
    gpu_index           INTEGER NOT NULL,
    at_ms               INTEGER NOT NULL,
    utilisation_percent INTEGER NOT NULL CHECK (utilisation_percent BETWEEN 0 AND 100),
    -- The energy counter (millijoules since the driver loaded), where the GPU has one.
    energy_mj           INTEGER,
    PRIMARY KEY (machine, gpu_index, at_ms)
) WITHOUT ROWID;
