-- Migration 1 (run once per file, in one write transaction, by the first
-- connection that finds PRAGMA user_version < 1; a file created by an earlier
-- version has the tables of schema.sql and version 0).
-- source_id: the id a publisher gave its event, for deduplication (NULL when
-- the backend made one up, so those events stay out of the unique index).
-- head: the newest event id of the group's topic, kept by the trigger below
-- (also for inserts by earlier versions still running on the file), so that
-- "head > cursor" finds the groups with unread events through a partial index
-- without visiting idle groups.
ALTER TABLE tenure_events ADD COLUMN source_id TEXT;
ALTER TABLE tenure_groups ADD COLUMN head INTEGER NOT NULL DEFAULT 0;
UPDATE tenure_groups SET head = coalesce(
    (SELECT max(e.id) FROM tenure_events AS e WHERE e.topic = tenure_groups.topic), 0);
CREATE UNIQUE INDEX IF NOT EXISTS tenure_events_source ON tenure_events (topic, source_id)
WHERE source_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS tenure_groups_unread ON tenure_groups (name, topic)
WHERE head > cursor;
CREATE TRIGGER IF NOT EXISTS tenure_events_head AFTER INSERT ON tenure_events
BEGIN
    UPDATE tenure_groups SET head = NEW.id WHERE topic = NEW.topic;
END;
PRAGMA user_version = 1;
