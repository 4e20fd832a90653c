-- A GPU cut into MIG instances keeps the profiles it was cut into, in order of their placement (a JSON
-- list such as ["3g.71gb", "1g.18gb"]): a made-up GPU of the demo fleet is cut again from it at each start,
-- and the console shows what was decided beside what the driver reports.
ALTER TABLE gpu_sharing ADD COLUMN mig_instances TEXT
    CHECK (mig_instances IS NULL OR (mode = 'mig' AND json_valid(mig_instances)));
