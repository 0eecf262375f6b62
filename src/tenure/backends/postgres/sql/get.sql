-- get_lease / get_lease_owner: the live lease, or no row.
SELECT t.owner, t.token,
       ceil(extract(epoch FROM t.deadline - c.now) * 1000)::bigint AS ttl_ms
FROM {table} AS t, (SELECT {now}() AS now) AS c
WHERE t.key = %(key)s AND t.owner IS NOT NULL AND t.deadline > c.now
