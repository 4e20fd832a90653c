-- How each GPU is shared, where it is not time-sliced (the default, which has no row): under MPS, with the
-- compute share each engine gets where the operator set one. A row names a GPU by machine and index, as the
-- ledger does; it outlives the GPU's absence from a reading, so a GPU that comes back is shared as before.
CREATE TABLE gpu_sharing (
    machine TEXT NOT NULL,
    gpu_index INTEGER NOT NULL CHECK (gpu_index >= 0),
    mode TEXT NOT NULL CHECK (mode IN ('mps', 'mig')),
    compute_percent INTEGER CHECK (compute_percent BETWEEN 1 AND 100),
    PRIMARY KEY (machine, gpu_index)
);
