-- release_lease: free the row if the caller holds it (an expired lease still
-- marked with the caller's name is freed too: nobody else holds it). The row
-- and its token stay, so the next owner gets token + 1. Only when a waiter is
-- registered for the key (waiter_register.sql, committed before the waiter
-- reads the lease) is a notification sent, at commit: it wakes one waiter in
-- every listening process. The payload is the key in hex because NOTIFY
-- payloads are text and cannot hold NUL.
-- The commit does not wait for the WAL flush (synchronous_commit off, for
-- this transaction only): a release lost in a server crash leaves the lease
-- to expire at its deadline, which is safe, and the next grant, committed
-- synchronously, flushes the release with it. A hand-off then waits for one
-- flush, the grant's, instead of two.
WITH r AS (
    UPDATE {table} AS t SET owner = NULL
    WHERE t.key = %(key)s AND t.owner = %(owner)s
      AND pg_catalog.set_config('synchronous_commit', 'off', true) IS NOT NULL
    RETURNING t.key
)
SELECT (SELECT count(pg_catalog.pg_notify(%(channel)s, encode(w.key, 'hex')))
        FROM (SELECT w.key FROM {waiters} AS w
              WHERE w.key = r.key AND w.until > {now}() LIMIT 1) AS w)
FROM r
