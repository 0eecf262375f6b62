-- Retention: at most a count of items, none older than a time, never the newest.
-- Parameters: stream, last position, max items, oldest time kept.
-- One range of the primary key: items are stored in time order, so the aged
-- ones are those before the first kept item, found by walking from the oldest
-- (which stops at once when nothing has aged). A condition on "at" over the
-- whole stream would read every item it keeps on every append.
DELETE FROM tenure_output
WHERE stream = ?1
  AND pos < min(?2, max(?2 - ?3 + 1,
                        coalesce((SELECT pos FROM tenure_output
                                  WHERE stream = ?1 AND at >= ?4 ORDER BY pos LIMIT 1), ?2)))
