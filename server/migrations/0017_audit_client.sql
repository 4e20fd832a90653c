-- The address of the client whose request made the change (issue 30): the last X-Forwarded-For hop that is
-- not a trusted proxy, or the connection's peer. NULL for what the server does by itself, and for entries
-- written before this was kept.
ALTER TABLE audit ADD COLUMN client TEXT;
