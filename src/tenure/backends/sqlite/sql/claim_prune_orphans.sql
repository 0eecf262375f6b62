-- Claims of events that were pruned.
DELETE FROM tenure_pending WHERE NOT EXISTS
(SELECT 1 FROM tenure_events AS e WHERE e.id = tenure_pending.event_id)
