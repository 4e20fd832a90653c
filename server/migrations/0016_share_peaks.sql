-- The most each model's engine was measured to hold on a GPU, per share it had there (issue 32): the
-- Models tab says "peak 4.1 GB of its 10 GB share over 3 days" from it and offers a smaller share where one
-- would do. A row per holder, GPU and share, so that a share changed starts a fresh peak; first_ms and
-- last_ms bound the readings it was taken from.
CREATE TABLE share_peaks (
    holder          TEXT NOT NULL,
    model           TEXT NOT NULL,
    machine         TEXT NOT NULL,
    gpu_index       INTEGER NOT NULL,
    share_bytes     INTEGER NOT NULL CHECK (share_bytes > 0),
    gpu_total_bytes INTEGER NOT NULL CHECK (gpu_total_bytes > 0),
    peak_bytes      INTEGER NOT NULL CHECK (peak_bytes >= 0),
    first_ms        INTEGER NOT NULL,
    last_ms         INTEGER NOT NULL CHECK (last_ms >= first_ms),
    PRIMARY KEY (holder, machine, gpu_index, share_bytes)
);
CREATE INDEX share_peaks_by_model ON share_peaks (model, last_ms);
