-- Named groups that have had no live member since before the cut (now minus
-- group_retention), have read every event of their topic (head: the topic's
-- newest event id) and hold no claim: forgotten, so a finished thread leaves
-- no row. Parameter: now - group_retention.
DELETE FROM tenure_groups
WHERE private = 0 AND alive_until < ?1 AND cursor >= head
  AND NOT EXISTS (SELECT 1 FROM tenure_pending AS p WHERE p.group_id = tenure_groups.id)
