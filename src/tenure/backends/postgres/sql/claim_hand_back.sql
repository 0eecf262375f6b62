-- Claims this instance took and never delivered (it is leaving the group):
-- due at once for the other members, who are notified; the attempt never
-- made is not counted.
WITH back AS (
    UPDATE {claims} AS c
    SET attempt = c.attempt - 1, visible_at = '-infinity', consumer = NULL
    FROM unnest(%(groups)s::bigint[], %(events)s::bigint[], %(attempts)s::integer[])
        AS a(group_id, event_id, attempt)
    WHERE c.group_id = a.group_id AND c.event_id = a.event_id
      AND c.consumer = %(consumer)s AND c.attempt = a.attempt
    RETURNING 1
)
SELECT count(pg_catalog.pg_notify(%(channel)s, encode(%(topic)s, 'hex')))
FROM (SELECT 1 FROM back LIMIT 1) AS any_back
