-- release_lease: free the row if the caller holds it (an expired lease still
-- marked with the caller's name is freed too: nobody else holds it). The row
-- and its token stay, so the next owner gets token + 1. The notification
-- (sent at commit) wakes one waiter in every listening process; the payload
-- is the key in hex because NOTIFY payloads are text and cannot hold NUL.
UPDATE {table} AS t SET owner = NULL
WHERE t.key = %(key)s AND t.owner = %(owner)s
RETURNING pg_catalog.pg_notify(%(channel)s, encode(t.key, 'hex'))
