-- Forget a private (fan-out) group.
DELETE FROM tenure_groups WHERE id = ?
