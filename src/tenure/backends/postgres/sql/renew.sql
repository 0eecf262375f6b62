-- renew_lease: a fresh full TTL if the caller still holds a live lease.
-- The inner SELECT … FOR UPDATE takes the row lock first; the clock is read
-- above it, so after waiting for a lock (a long transaction elsewhere) the
-- lease is judged on the time of the decision and an expired lease is never
-- resurrected. A plain UPDATE … WHERE would judge on the time before the wait.
UPDATE {table} AS t SET deadline = c.now + %(ttl_ms)s * interval '1 millisecond'
FROM (
    SELECT l.key, l.owner, l.deadline, {now}() AS now
    FROM (SELECT key, owner, deadline FROM {table} WHERE key = %(key)s FOR UPDATE) AS l
) AS c
WHERE t.key = c.key AND c.owner = %(owner)s AND c.deadline > c.now
RETURNING 1
