-- A failed attempt: redelivered after the visibility timeout.
-- Parameters: attempt, visible_at, group id, event id.
UPDATE tenure_pending SET attempt = ?, visible_at = ? WHERE group_id = ? AND event_id = ?
