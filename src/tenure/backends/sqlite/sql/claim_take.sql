-- Claim a due event again for this consumer.
-- Parameters: attempt, visible_at, consumer, group id, event id.
UPDATE tenure_pending SET attempt = ?, visible_at = ?, consumer = ?
WHERE group_id = ? AND event_id = ?
