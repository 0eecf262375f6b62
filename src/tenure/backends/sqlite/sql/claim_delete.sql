-- A dropped claim (delivered max_attempts times, or its event pruned).
-- Parameters: group id, event id.
DELETE FROM tenure_pending WHERE group_id = ? AND event_id = ?
