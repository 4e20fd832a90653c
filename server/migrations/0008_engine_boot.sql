-- The boot an engine was recorded in (/proc/sys/kernel/random/boot_id): after a reboot PIDs and start
-- times repeat, so a row from another boot names some other process and is never adopted or stopped.
-- Rows from before this column have no boot, and are not trusted either.
ALTER TABLE engines ADD COLUMN boot_id TEXT NOT NULL DEFAULT '';
