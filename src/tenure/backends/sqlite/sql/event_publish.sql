-- Append an event, only if its topic has a consumer group (nobody would read it),
-- and not if an event with the same publisher-given id is kept for the topic
-- (the unique index on (topic, source_id) makes that check atomic).
-- Parameters: topic, body, the time it is stored (the created_at column: what
-- retention and the dedupe window count from), source_id (NULL: no id given).
INSERT INTO tenure_events (topic, body, created_at, source_id)
SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM tenure_groups WHERE topic = ?1)
ON CONFLICT DO NOTHING
