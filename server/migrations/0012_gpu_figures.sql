-- What the machine page charts besides utilisation: each reading's memory in use (by anyone), what of it is
-- held outside Tessera (the rest is Tessera's engines'), the temperature and the power draw. NULL where the
-- GPU did not report it, and for the readings kept before these were.
ALTER TABLE gpu_samples ADD COLUMN used_bytes INTEGER;
ALTER TABLE gpu_samples ADD COLUMN held_outside_bytes INTEGER;
ALTER TABLE gpu_samples ADD COLUMN temperature_c INTEGER;
ALTER TABLE gpu_samples ADD COLUMN power_mw INTEGER;
