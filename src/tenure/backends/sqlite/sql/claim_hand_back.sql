-- A claim this consumer never delivered, visible to the other members at once;
-- the attempt it never made is not counted.
-- Parameters: attempt, group id, event id, consumer.
UPDATE tenure_pending SET attempt = ?, visible_at = 0, consumer = NULL
WHERE group_id = ? AND event_id = ? AND consumer = ?
