-- Create a group at the log's current end, unless it exists.
-- Parameters: topic, name, private (0 or 1), alive_until.
INSERT OR IGNORE INTO tenure_groups (topic, name, cursor, private, alive_until)
VALUES (?, ?, (SELECT coalesce(max(id), 0) FROM tenure_events), ?, ?)
