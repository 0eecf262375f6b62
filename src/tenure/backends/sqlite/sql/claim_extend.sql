-- Heartbeat of a claim this consumer still holds.
-- Parameters: visible_at, group id, event id, consumer.
UPDATE tenure_pending SET visible_at = ?
WHERE group_id = ? AND event_id = ? AND consumer = ?
