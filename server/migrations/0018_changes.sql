-- What a write changed of the committed state (issue 29): the triggers below note each row a write inserts,
-- updates or deletes, by kind and key, inside the write's own transaction. The fleet reads and empties the
-- table before that transaction commits, and applies just those rows to what it holds in memory, where it
-- had read the whole committed state back after every write. Committed, it is always empty; rows left by a
-- change made outside the server are taken up at its next start.
CREATE TABLE changes (
    -- 'worker' (key: its name), 'group' (its name), 'model' (its name), 'sharing' (machine:index).
    kind TEXT NOT NULL,
    key  TEXT NOT NULL,
    PRIMARY KEY (kind, key)
) WITHOUT ROWID;

CREATE TRIGGER workers_inserted AFTER INSERT ON workers BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('worker', NEW.name);
END;
CREATE TRIGGER workers_updated AFTER UPDATE ON workers BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('worker', OLD.name), ('worker', NEW.name);
END;
CREATE TRIGGER workers_deleted AFTER DELETE ON workers BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('worker', OLD.name);
END;

CREATE TRIGGER groups_inserted AFTER INSERT ON groups BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('group', NEW.name);
END;
CREATE TRIGGER groups_updated AFTER UPDATE ON groups BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('group', OLD.name), ('group', NEW.name);
END;
CREATE TRIGGER groups_deleted AFTER DELETE ON groups BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('group', OLD.name);
END;

CREATE TRIGGER group_members_inserted AFTER INSERT ON group_members BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('group', NEW.group_name);
END;
CREATE TRIGGER group_members_updated AFTER UPDATE ON group_members BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('group', OLD.group_name), ('group', NEW.group_name);
END;
CREATE TRIGGER group_members_deleted AFTER DELETE ON group_members BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('group', OLD.group_name);
END;

CREATE TRIGGER models_inserted AFTER INSERT ON models BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('model', NEW.name);
END;
CREATE TRIGGER models_updated AFTER UPDATE ON models BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('model', OLD.name), ('model', NEW.name);
END;
CREATE TRIGGER models_deleted AFTER DELETE ON models BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('model', OLD.name);
END;

CREATE TRIGGER gpu_sharing_inserted AFTER INSERT ON gpu_sharing BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('sharing', NEW.machine || ':' || NEW.gpu_index);
END;
CREATE TRIGGER gpu_sharing_updated AFTER UPDATE ON gpu_sharing BEGIN
    INSERT OR IGNORE INTO changes (kind, key)
    VALUES ('sharing', OLD.machine || ':' || OLD.gpu_index), ('sharing', NEW.machine || ':' || NEW.gpu_index);
END;
CREATE TRIGGER gpu_sharing_deleted AFTER DELETE ON gpu_sharing BEGIN
    INSERT OR IGNORE INTO changes (kind, key) VALUES ('sharing', OLD.machine || ':' || OLD.gpu_index);
END;
