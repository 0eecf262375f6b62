-- scan_leases: a page of live leases with keys in [low, high), in key order
-- (bytea compares byte-wise, so the primary key's index gives the range).
SELECT t.key, t.owner, t.token,
       ceil(extract(epoch FROM t.deadline - c.now) * 1000)::bigint AS ttl_ms
FROM {table} AS t, (SELECT {now}() AS now) AS c
WHERE t.key >= %(low)s AND t.key < %(high)s
  AND t.owner IS NOT NULL AND t.deadline > c.now
ORDER BY t.key
LIMIT %(page)s
