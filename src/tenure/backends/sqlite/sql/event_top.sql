-- The newest event id of a topic (0 if none).
SELECT coalesce(max(id), 0) FROM tenure_events WHERE topic = ?
