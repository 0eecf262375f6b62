-- A page of live leases with keys in [low, high), in key order.
-- Parameters: low, high, now, page size.
SELECT key, owner, token, deadline FROM tenure_leases
WHERE key >= ? AND key < ? AND deadline > ?
ORDER BY key LIMIT ?
