-- Append an event, only if its topic has a consumer group (nobody would read it).
-- Parameters: topic, body, created_at.
INSERT INTO tenure_events (topic, body, created_at)
SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM tenure_groups WHERE topic = ?1)
