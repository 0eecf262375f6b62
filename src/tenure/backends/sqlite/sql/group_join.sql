-- Create a group at the log's current end, unless it exists; either way it is
-- alive for the joining member from now (so the prune of idle named groups,
-- group_prune_idle.sql, cannot delete a group between its join and the
-- member's first heartbeat).
-- Parameters: topic, name, private (0 or 1), alive_until.
INSERT INTO tenure_groups (topic, name, cursor, private, alive_until)
VALUES (?1, ?2, (SELECT coalesce(max(id), 0) FROM tenure_events), ?3, ?4)
ON CONFLICT (topic, name) DO UPDATE SET alive_until = max(alive_until, excluded.alive_until)
