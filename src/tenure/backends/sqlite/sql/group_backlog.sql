-- Topics in [low, high) whose group of this name has unread events (the partial
-- index tenure_groups_unread holds only groups with head > cursor) or claims not
-- acknowledged (one pass over the claims in flight).
-- Parameters: group name, low, high.
SELECT g.topic FROM tenure_groups AS g
WHERE g.name = ?1 AND g.topic >= ?2 AND g.topic < ?3 AND g.head > g.cursor
  AND EXISTS (SELECT 1 FROM tenure_events AS e WHERE e.topic = g.topic AND e.id > g.cursor)
UNION
SELECT g.topic FROM tenure_pending AS p CROSS JOIN tenure_groups AS g
WHERE g.id = p.group_id AND g.name = ?1 AND g.topic >= ?2 AND g.topic < ?3
