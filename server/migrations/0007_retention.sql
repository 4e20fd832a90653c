-- Retention: GPU readings are kept raw for a while (a week by default), then rolled up into runs; closed
-- holdings, runs and audit entries older than their retention (400 days by default) are deleted.

-- One GPU's readings rolled up: a run of consecutive readings within one hour, never across the start or
-- the end of a holding on that GPU. Its first and last readings are kept whole, so that the pair from one
-- run's last reading to the next's first counts in a report as any pair of readings does; the pairs inside
-- it are kept as the sums the usage report takes from them. A report over whole hours therefore gives the
-- same figures from the runs as it gave from the readings.
CREATE TABLE gpu_sample_runs (
    machine                   TEXT    NOT NULL,
    gpu_index                 INTEGER NOT NULL,
    first_ms                  INTEGER NOT NULL,
    first_utilisation_percent INTEGER NOT NULL CHECK (first_utilisation_percent BETWEEN 0 AND 100),
    first_energy_mj           INTEGER,
    last_ms                   INTEGER NOT NULL,
    last_utilisation_percent  INTEGER NOT NULL CHECK (last_utilisation_percent BETWEEN 0 AND 100),
    last_energy_mj            INTEGER,
    -- How many readings it stands for.
    samples                   INTEGER NOT NULL CHECK (samples >= 1),
    -- Over the pairs of readings inside it: the time weighted by utilisation, in milliseconds (each pair
    -- rounded down, as the report rounds it), NULL with no pair; the energy counter's growth in millijoules
    -- over the pairs whose counter did not go back, NULL with none.
    busy_ms                   INTEGER CHECK (busy_ms >= 0),
    energy_mj                 INTEGER CHECK (energy_mj >= 0),
    PRIMARY KEY (machine, gpu_index, first_ms),
    CHECK (last_ms >= first_ms)
) WITHOUT ROWID;
CREATE INDEX gpu_sample_runs_last ON gpu_sample_runs (last_ms);

-- What retention deletes by.
CREATE INDEX holdings_end ON holdings (end_ms) WHERE end_ms IS NOT NULL;
CREATE INDEX audit_at ON audit (at);
