-- A claim this consumer never delivered, visible to the other members at once;
-- the attempt it never made is not counted.
-- Parameters: group id, event id, consumer, attempt it was claimed for.
UPDATE tenure_pending SET attempt = attempt - 1, visible_at = 0, consumer = NULL
WHERE group_id = ? AND event_id = ? AND consumer = ? AND attempt = ?
