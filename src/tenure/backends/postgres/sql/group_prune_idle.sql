-- Named groups that have had no live member for the retention (group_retention
-- seconds) and hold no claim (every event published to them was acknowledged):
-- forgotten, so a finished thread leaves no row. A join racing this delete
-- either refreshes alive_until first (the delete, re-checking the row, skips
-- it) or waits for it and makes the group anew. A publish racing it may write
-- a claim for the deleted group: claim_prune_orphans.sql removes it, as for a
-- publish to a topic without a group (nothing kept for nobody).
DELETE FROM {groups} AS g
WHERE NOT g.private
  AND g.alive_until < {now}() - %(retention)s * interval '1 second'
  AND NOT EXISTS (SELECT 1 FROM {claims} AS c WHERE c.group_id = g.id)
