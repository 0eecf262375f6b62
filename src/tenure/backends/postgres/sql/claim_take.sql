-- A member takes up to limit claims of its group that are due (never taken,
-- handed back, reclaimed, or not acknowledged within the visibility timeout),
-- oldest event first. SKIP LOCKED: members taking at once never wait for each
-- other, and each claim goes to one of them. Rows come back in no particular
-- order (the caller sorts them); attempt counts this delivery.
-- The commit does not wait for the WAL flush (synchronous_commit off, for this
-- transaction only): a take lost in a server crash leaves its claims due
-- again, so they are delivered again (at least once), and an acknowledgement,
-- committed later and synchronously, makes the take durable with it.
-- With retake, the member also takes back the claims it holds but does not
-- know of (not in held): what a take whose answer it never got (a time-out, a
-- broken connection) may have claimed, which would otherwise stay invisible
-- until the visibility timeout, behind newer events.
UPDATE {claims} AS c
SET attempt = c.attempt + 1,
    visible_at = n.now + %(visible)s * interval '1 second',
    consumer = %(consumer)s
FROM (SELECT {now}() AS now,
             pg_catalog.set_config('synchronous_commit', 'off', true) AS async) AS n,
     (SELECT group_id, event_id FROM {claims}
      WHERE group_id = %(group)s
        AND (visible_at <= {now}()
             OR (%(retake)s AND consumer = %(consumer)s
                 AND NOT (event_id = ANY(%(held)s::bigint[]))))
      ORDER BY event_id
      LIMIT %(limit)s
      FOR UPDATE SKIP LOCKED) AS s,
     {events} AS e
WHERE c.group_id = s.group_id AND c.event_id = s.event_id AND e.id = c.event_id
RETURNING c.event_id, c.attempt, e.body
