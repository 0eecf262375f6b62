-- A group's cursor (no row: the group was deleted as stale).
SELECT cursor FROM tenure_groups WHERE id = ?
