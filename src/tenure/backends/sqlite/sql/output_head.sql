-- The stream's last position (0: none yet). Parameter: stream.
SELECT COALESCE(max(pos), 0) FROM tenure_output WHERE stream = ?1
