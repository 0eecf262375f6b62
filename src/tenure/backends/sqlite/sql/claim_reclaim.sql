-- Every claim of a named group that a member took: visible to the group at once.
-- The next take counts one more attempt. Returns the claims as they were taken.
-- Parameters: topic, group name.
UPDATE tenure_pending SET visible_at = 0, consumer = NULL
WHERE group_id = (SELECT id FROM tenure_groups WHERE topic = ?1 AND name = ?2)
  AND consumer IS NOT NULL
RETURNING event_id, attempt, consumer
