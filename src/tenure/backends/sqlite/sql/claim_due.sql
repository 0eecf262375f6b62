-- A group's claims due for redelivery, with their event (body NULL: pruned).
-- Parameters: group id, now, limit.
SELECT p.event_id, p.attempt, e.body FROM tenure_pending AS p
LEFT JOIN tenure_events AS e ON e.id = p.event_id
WHERE p.group_id = ? AND p.visible_at <= ? ORDER BY p.event_id LIMIT ?
