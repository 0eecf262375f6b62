-- Whether a group has a claim due for (re)delivery. Parameters: group id, now.
SELECT 1 FROM tenure_pending WHERE group_id = ? AND visible_at <= ? LIMIT 1
