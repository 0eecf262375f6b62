-- Groups whose unread events were all pruned (older than the retention): their
-- cursor moves to the topic's head, so they leave the unread index.
UPDATE tenure_groups SET cursor = head
WHERE head > cursor
  AND NOT EXISTS (SELECT 1 FROM tenure_events AS e
                  WHERE e.topic = tenure_groups.topic AND e.id > tenure_groups.cursor)
