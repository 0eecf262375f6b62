-- Move a group's cursor past the events just claimed. Parameters: cursor, group id.
UPDATE tenure_groups SET cursor = ? WHERE id = ?
