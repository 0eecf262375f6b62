-- Every claim of a private group that is being forgotten.
DELETE FROM tenure_pending WHERE group_id = ?
