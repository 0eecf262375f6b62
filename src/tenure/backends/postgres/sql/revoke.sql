-- revoke_lease: free the live lease of a key whoever holds it; with a token,
-- only if the lease still carries it. The row and its token stay, so the next
-- owner gets token + 1. A registered waiter is notified as by release.sql.
-- One row when a lease was revoked, none otherwise.
WITH r AS (
    UPDATE {table} AS t SET owner = NULL
    WHERE t.key = %(key)s AND t.owner IS NOT NULL AND t.deadline > {now}()
      AND (%(token)s::bigint IS NULL OR t.token = %(token)s::bigint)
    RETURNING t.key
)
SELECT (SELECT count(pg_catalog.pg_notify(%(channel)s, encode(w.key, 'hex')))
        FROM (SELECT w.key FROM {waiters} AS w
              WHERE w.key = r.key AND w.until > {now}() LIMIT 1) AS w)
FROM r
