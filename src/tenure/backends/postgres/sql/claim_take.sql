-- A member takes up to limit claims of its group that are due (never taken,
-- handed back, reclaimed, or not acknowledged within the visibility timeout),
-- oldest event first. SKIP LOCKED: members taking at once never wait for each
-- other, and each claim goes to one of them. Rows come back in no particular
-- order (the caller sorts them); attempt counts this delivery. While a
-- redelivery is due, one claim at a time.
-- The commit does not wait for the WAL flush (synchronous_commit off, for this
-- transaction only): a take lost in a server crash leaves its claims due
-- again, so they are delivered again (at least once), and an acknowledgement,
-- committed later and synchronously, makes the take durable with it.
-- With retake, the member also takes back the claims it holds but does not
-- know of (not in held): what a take whose answer it never got (a time-out, a
-- broken connection) may have claimed, which would otherwise stay invisible
-- until the visibility timeout, behind newer events.
-- Fenced (fence_keys not empty): the take happens only while one of those
-- lease keys is live and held by an owner starting with the matching prefix,
-- judged in this statement; otherwise it takes nothing and answers one row of
-- NULLs. A member whose lease is gone (a stale reader: paused, cut off, or
-- slow to learn of the loss) then cannot take what the lease's new holder
-- reclaimed or is about to read, however late its statement arrives.
WITH n AS (
    SELECT {now}() AS now,
           pg_catalog.set_config('synchronous_commit', 'off', true) AS async
), f AS (
    SELECT cardinality(%(fence_keys)s::bytea[]) = 0
           OR EXISTS (SELECT 1
                      FROM unnest(%(fence_keys)s::bytea[], %(fence_prefixes)s::bytea[])
                          AS p(key, prefix)
                      JOIN {table} AS l ON l.key = p.key
                      WHERE l.deadline > (SELECT now FROM n)
                        AND substring(l.owner FROM 1 FOR length(p.prefix)) = p.prefix) AS ok
), taken AS (
    UPDATE {claims} AS c
    SET attempt = c.attempt + 1,
        visible_at = n.now + %(visible)s * interval '1 second',
        consumer = %(consumer)s
    FROM n,
         (SELECT group_id, event_id FROM {claims}
          WHERE (SELECT ok FROM f)  -- fenced out: not even looked at, nothing locked
            AND group_id = %(group)s
            AND (visible_at <= {now}()
                 OR (%(retake)s AND consumer = %(consumer)s
                     AND NOT (event_id = ANY(%(held)s::bigint[]))))
          ORDER BY event_id
          -- One at a time while a redelivery is due: each claim taken counts a
          -- delivery, and claims a member took and never reached (it died)
          -- would otherwise count one more each time, until innocent events
          -- behind one that kills its readers reach max_attempts.
          LIMIT CASE WHEN EXISTS (SELECT 1 FROM {claims}
                                  WHERE group_id = %(group)s AND attempt > 0
                                    AND visible_at <= {now}())
                     THEN 1 ELSE %(limit)s END
          FOR UPDATE SKIP LOCKED) AS s,
         {events} AS e
    WHERE c.group_id = s.group_id AND c.event_id = s.event_id AND e.id = c.event_id
    RETURNING c.event_id, c.attempt, e.body
)
SELECT event_id, attempt, body FROM taken
UNION ALL
SELECT NULL, NULL, NULL FROM f WHERE NOT f.ok
