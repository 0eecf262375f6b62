-- The kept event of a topic with a publisher-given id. Parameters: topic, source_id.
SELECT body FROM tenure_events WHERE topic = ? AND source_id = ?
