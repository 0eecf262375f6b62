-- Events of a topic after a group's cursor, oldest first. Parameters: topic, cursor, limit.
SELECT id, body FROM tenure_events WHERE topic = ? AND id > ? ORDER BY id LIMIT ?
