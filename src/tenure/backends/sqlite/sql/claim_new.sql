-- Claim a fresh event for this consumer (first attempt).
-- Parameters: group id, event id, visible_at, consumer.
INSERT OR REPLACE INTO tenure_pending (group_id, event_id, attempt, visible_at, consumer)
VALUES (?, ?, 1, ?, ?)
