-- Append one item at the stream's next position, only while the writer holds
-- the lease with this token: the fence and the append are one statement.
-- Parameters: stream, body, at, lease key, owner, token, now (the lease clock).
INSERT INTO tenure_output (stream, pos, body, at)
SELECT ?1, COALESCE((SELECT max(pos) FROM tenure_output WHERE stream = ?1), 0) + 1, ?2, ?3
WHERE EXISTS (SELECT 1 FROM tenure_leases
              WHERE key = ?4 AND owner = ?5 AND token = ?6 AND deadline > ?7)
RETURNING pos
