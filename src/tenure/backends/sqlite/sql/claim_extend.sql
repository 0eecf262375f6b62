-- Heartbeat of the claims this consumer still holds; returns those extended (a
-- claim not returned was reclaimed or taken). {rows} is replaced by one (?, ?, ?)
-- per claim. Parameters: visible_at, consumer, then group id, event id and
-- attempt of each claim.
UPDATE tenure_pending SET visible_at = ?
WHERE consumer = ? AND (group_id, event_id, attempt) IN (VALUES {rows})
RETURNING group_id, event_id, attempt
