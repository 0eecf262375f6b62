-- Change detection: the topics that got events after an id, with their newest id.
SELECT topic, max(id) FROM tenure_events WHERE id > ? GROUP BY topic
