-- Engines that sleep instead of stopping (issue 45): an on-demand member past its keep-alive whose engine can
-- sleep is put to sleep, not stopped. `asleep` is NULL for a member awake or not loaded; for one asleep, JSON:
-- `since_ms` (when it was put to sleep) and `held` (what it keeps on each of its GPUs, in basis points of the
-- GPU, measured once it slept; null until then, when it holds its whole share).
ALTER TABLE group_members ADD COLUMN asleep TEXT;
