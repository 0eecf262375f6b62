-- renew_owned: many (key, owner) pairs, each owner its own, in one statement;
-- returns the keys that were renewed. Rows are locked first, in key order (so
-- concurrent batches do not deadlock), then judged on the clock read after
-- the locks (as in renew.sql). The caller sends each key once.
UPDATE {table} AS t SET deadline = c.now + %(ttl_ms)s * interval '1 millisecond'
FROM (
    SELECT l.key, l.deadline, {now}() AS now
    FROM (
        SELECT x.key, x.deadline FROM {table} AS x
        JOIN unnest(%(keys)s::bytea[], %(owners)s::bytea[]) AS p (key, owner)
            ON x.key = p.key AND x.owner = p.owner
        ORDER BY x.key
        FOR UPDATE OF x
    ) AS l
) AS c
WHERE t.key = c.key AND c.deadline > c.now
RETURNING t.key
