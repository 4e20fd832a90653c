-- Pinned and on-demand members (seed 002's hybrid). A pinned member (the default) is always loaded; an
-- on-demand one runs an engine only while loaded: a request through the gateway loads it, and after
-- `keep_alive_s` with no request it unloads.
ALTER TABLE group_members ADD COLUMN on_demand INTEGER NOT NULL DEFAULT 0 CHECK (on_demand IN (0, 1));
ALTER TABLE group_members ADD COLUMN keep_alive_s INTEGER NOT NULL DEFAULT 300
    CHECK (keep_alive_s BETWEEN 10 AND 604800);
-- Whether an on-demand member is loaded now: committed like a share, so that the ledger holds its memory
-- and a restarted server adopts its engine rather than stopping it.
ALTER TABLE group_members ADD COLUMN loaded INTEGER NOT NULL DEFAULT 0 CHECK (loaded IN (0, 1));
