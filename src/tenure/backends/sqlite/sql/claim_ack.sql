-- An acknowledged or dropped delivery, if the claim is still the one delivered
-- (a reclaim or another member's take changed its consumer or attempt).
-- Parameters: group id, event id, consumer, attempt delivered.
DELETE FROM tenure_pending WHERE group_id = ? AND event_id = ? AND consumer = ? AND attempt = ?
