-- A failed attempt, if the claim is still the one delivered: the consumer delivers
-- it again itself; others see it after the visibility timeout.
-- Parameters: visible_at, group id, event id, consumer, attempt that failed.
UPDATE tenure_pending SET attempt = attempt + 1, visible_at = ?
WHERE group_id = ? AND event_id = ? AND consumer = ? AND attempt = ?
