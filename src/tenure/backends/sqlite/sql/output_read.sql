-- Items after a position, in order. Parameters: stream, after, limit.
SELECT pos, body FROM tenure_output WHERE stream = ?1 AND pos > ?2 ORDER BY pos LIMIT ?3
