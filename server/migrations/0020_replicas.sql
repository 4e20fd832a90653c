-- Replicas that follow traffic (issue 44): a member deployed with `replicas` runs on some of its group's
-- machines, between `min` and `max` of them. `autoscale` is its setting as JSON (NULL for a member that runs
-- on every machine of its group, as before); `placed` the machines it runs on now, as a JSON array, kept so
-- that a restart of Tessera finds its replicas where they were.
ALTER TABLE group_members ADD COLUMN autoscale TEXT;
ALTER TABLE group_members ADD COLUMN placed TEXT;
