-- Claims of a group deleted while a publish that still saw it was writing them.
DELETE FROM {claims} AS c
WHERE NOT EXISTS (SELECT 1 FROM {groups} AS g WHERE g.id = c.group_id)
