-- transfer_lease: hand a live lease to another owner in one row update, so
-- the key is never free in between; new token, fresh full TTL. The row is
-- locked before the clock is read (see renew.sql). Notifies like a
-- release (only when someone waits), so a waiter for the key looks again.
WITH r AS (
    UPDATE {table} AS t
    SET owner = %(to_owner)s, token = c.token + 1,
        deadline = c.now + %(ttl_ms)s * interval '1 millisecond'
    FROM (
        SELECT l.key, l.owner, l.token, l.deadline, {now}() AS now
        FROM (SELECT key, owner, token, deadline FROM {table} WHERE key = %(key)s FOR UPDATE) AS l
    ) AS c
    WHERE t.key = c.key AND c.owner = %(from_owner)s AND c.deadline > c.now
    RETURNING t.key
)
SELECT (SELECT count(pg_catalog.pg_notify(%(channel)s, encode(w.key, 'hex')))
        FROM (SELECT w.key FROM {waiters} AS w
              WHERE w.key = r.key AND w.until > {now}() LIMIT 1) AS w)
FROM r
