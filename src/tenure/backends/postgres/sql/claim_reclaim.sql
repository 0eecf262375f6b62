-- reclaim: every claim of a named group that a member took and has not
-- acknowledged is due at once (the members are notified); the next take
-- counts one more attempt. Locked in event order (no deadlock with another
-- reclaim). Returns the claims as they were taken.
WITH back AS (
    UPDATE {claims} AS c SET visible_at = '-infinity', consumer = NULL
    FROM (SELECT group_id, event_id FROM {claims}
          WHERE group_id = (SELECT id FROM {groups}
                            WHERE topic = %(topic)s AND name = %(name)s AND NOT private)
            AND consumer IS NOT NULL
          ORDER BY event_id
          FOR UPDATE) AS s
    WHERE c.group_id = s.group_id AND c.event_id = s.event_id
    RETURNING c.event_id, c.attempt, c.consumer
)
SELECT back.event_id, back.attempt, back.consumer,
       (SELECT count(pg_catalog.pg_notify(%(channel)s, encode(%(topic)s, 'hex')))
        FROM (SELECT 1 FROM back LIMIT 1) AS any_back)
FROM back
