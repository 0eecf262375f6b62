-- Heartbeat of a group this instance uses. Parameters: alive_until, group id.
UPDATE tenure_groups SET alive_until = ? WHERE id = ?
