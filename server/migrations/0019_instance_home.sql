-- Where the database was last opened (issue 41): the machine's id and the database file's path. A copy of the
-- database opened anywhere else (a backup restored on a staging server, a data folder copied to another machine)
-- is a new installation with a token of its own, so that it neither adopts nor stops the engines of the
-- installation it was copied from. Empty until the first start after this migration, which keeps the token.
ALTER TABLE instance ADD COLUMN home TEXT;
