-- An acknowledged or dropped claim. Parameters: group id, event id.
DELETE FROM tenure_pending WHERE group_id = ? AND event_id = ?
