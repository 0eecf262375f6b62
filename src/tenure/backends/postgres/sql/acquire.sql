-- acquire_lease: one statement. A new key is inserted with a token seeded
-- from the server time in microseconds (so a key whose row was deleted by
-- hand still gets a higher token than before, as long as the server clock
-- does not go back). An existing row is locked, then judged on a clock read
-- after the lock was taken: held by someone else -> left as it is (the
-- no-op update lets RETURNING name the holder in the same atomic step);
-- held by the caller -> TTL refreshed, token kept; free or expired -> the
-- caller takes it with token + 1.
-- Result: one row (owner, token); acquired when owner = the caller.
INSERT INTO {table} AS t (key, owner, token, deadline)
SELECT %(key)s, %(owner)s,
       (extract(epoch FROM c.now) * 1000000)::bigint,
       c.now + %(ttl_ms)s * interval '1 millisecond'
FROM (SELECT {now}() AS now) AS c
ON CONFLICT (key) DO UPDATE SET (owner, token, deadline) = (
    SELECT
        CASE WHEN g.other THEN t.owner ELSE excluded.owner END,
        CASE WHEN g.other OR g.same THEN t.token ELSE t.token + 1 END,
        CASE WHEN g.other THEN t.deadline
             ELSE g.now + %(ttl_ms)s * interval '1 millisecond' END
    FROM (
        SELECT c2.now,
               t.owner IS NOT NULL AND t.deadline > c2.now AND t.owner <> excluded.owner AS other,
               t.owner IS NOT NULL AND t.deadline > c2.now AND t.owner = excluded.owner AS same
        FROM (SELECT {now}() AS now) AS c2
    ) AS g
)
RETURNING t.owner, t.token
