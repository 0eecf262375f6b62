-- A batch of outcomes, each naming the delivery it settles (consumer and
-- attempt), so one that a reclaim or another member's take replaced changes
-- nothing. Acknowledged: the claim goes, and the event too when it was the
-- last claim and the event need not be kept. Failed: attempt + 1, and other
-- members see it after the visibility timeout (the member delivers it again
-- itself). The caller names each claim at most once per batch.
WITH a AS (
    SELECT * FROM unnest(%(groups)s::bigint[], %(events)s::bigint[],
                         %(attempts)s::integer[], %(failed)s::boolean[])
        AS a(group_id, event_id, attempt, failed)
), acked AS (
    DELETE FROM {claims} AS c USING a
    WHERE NOT a.failed AND c.group_id = a.group_id AND c.event_id = a.event_id
      AND c.consumer = %(consumer)s AND c.attempt = a.attempt
    RETURNING c.group_id, c.event_id
), retried AS (
    UPDATE {claims} AS c
    SET attempt = c.attempt + 1, visible_at = {now}() + %(visible)s * interval '1 second'
    FROM a
    WHERE a.failed AND c.group_id = a.group_id AND c.event_id = a.event_id
      AND c.consumer = %(consumer)s AND c.attempt = a.attempt
)
DELETE FROM {events} AS e USING acked
WHERE e.id = acked.event_id AND e.keep_until <= {now}()
  AND NOT EXISTS (SELECT 1 FROM {claims} AS o
                  WHERE o.event_id = e.id AND o.group_id <> acked.group_id)
