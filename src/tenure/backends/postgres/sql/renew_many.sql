-- renew_leases: many keys of one owner in one statement; returns the keys
-- that were renewed. Rows are locked first, then judged on the clock read
-- after the locks (as in renew.sql). The caller sends each key once.
UPDATE {table} AS t SET deadline = c.now + %(ttl_ms)s * interval '1 millisecond'
FROM (
    SELECT l.key, l.deadline, {now}() AS now
    FROM (
        SELECT key, deadline FROM {table}
        WHERE key = ANY(%(keys)s::bytea[]) AND owner = %(owner)s
        ORDER BY key
        FOR UPDATE
    ) AS l
) AS c
WHERE t.key = c.key AND c.deadline > c.now
RETURNING t.key
