-- Heartbeat of the claims this instance holds and has not settled; returns
-- those it still holds (a missing one was reclaimed, or taken by another
-- member after its visibility timeout).
UPDATE {claims} AS c SET visible_at = {now}() + %(visible)s * interval '1 second'
FROM unnest(%(groups)s::bigint[], %(events)s::bigint[], %(attempts)s::integer[])
    AS a(group_id, event_id, attempt)
WHERE c.group_id = a.group_id AND c.event_id = a.event_id
  AND c.consumer = %(consumer)s AND c.attempt = a.attempt
RETURNING c.group_id, c.event_id
