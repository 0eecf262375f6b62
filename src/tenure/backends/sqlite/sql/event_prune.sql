-- Events older than the retention, and events every group of their topic has
-- passed and nobody still has claimed; those with a publisher-given id only once
-- older than the dedupe window. Parameters: now - retention, now - dedupe_window.
DELETE FROM tenure_events
WHERE created_at < ?1
   OR (id <= coalesce((SELECT min(g.cursor) FROM tenure_groups AS g
                       WHERE g.topic = tenure_events.topic), 9223372036854775807)
       AND NOT EXISTS (SELECT 1 FROM tenure_pending AS p WHERE p.event_id = tenure_events.id)
       AND (source_id IS NULL OR created_at < ?2))
