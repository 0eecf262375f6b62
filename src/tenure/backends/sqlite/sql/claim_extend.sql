-- Heartbeat of a claim this consumer still holds (no row: it was reclaimed or taken).
-- Parameters: visible_at, group id, event id, consumer, attempt.
UPDATE tenure_pending SET visible_at = ?
WHERE group_id = ? AND event_id = ? AND consumer = ? AND attempt = ?
