-- A GPU cut into MIG instances keeps the profiles it was cut into, in order of their placement (a JSON
-- list such as ["3g.71gb", "1g.18gb"]): a made-up GPU of the demo fleet is cut again from it at each start,
-- and one of this machine's whose instances a reboot took is cut again. Rows set to 'mig' before a cut
-- could be made (the API refused them) say no layout, so they are dropped: such a GPU was never cut.
DELETE FROM gpu_sharing WHERE mode = 'mig';
ALTER TABLE gpu_sharing ADD COLUMN mig_instances TEXT
    CHECK ((mode = 'mig') = (mig_instances IS NOT NULL) AND (mig_instances IS NULL OR json_valid(mig_instances)));
