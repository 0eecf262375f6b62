-- The groups among a list with nothing to fetch: no event after their cursor
-- (head, kept by the trigger on publish) and no claim due for (re)delivery.
-- A group not returned (something to fetch, or deleted) is woken to look.
-- {keys} is replaced by one ? per group id. Parameters: now, group ids.
SELECT g.id FROM tenure_groups AS g
WHERE g.head <= g.cursor
  AND NOT EXISTS (
    SELECT 1 FROM tenure_pending AS p WHERE p.group_id = g.id AND p.visible_at <= ?
  )
  AND g.id IN ({keys})
