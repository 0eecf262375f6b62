-- The newest event id of the log (0 if none).
SELECT coalesce(max(id), 0) FROM tenure_events
