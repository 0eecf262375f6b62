-- Retention: at most a count of items, none older than a time, never the newest.
-- Parameters: stream, last position, max items, oldest time kept.
DELETE FROM tenure_output
WHERE stream = ?1 AND pos < ?2 AND (pos <= ?2 - ?3 OR at < ?4)
