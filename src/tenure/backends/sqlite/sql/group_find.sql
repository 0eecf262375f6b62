-- A group's id and cursor by topic and name.
SELECT id, cursor FROM tenure_groups WHERE topic = ? AND name = ?
