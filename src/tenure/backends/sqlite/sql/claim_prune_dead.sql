-- Claims of private groups whose instance stopped heart-beating. Parameter: now.
DELETE FROM tenure_pending WHERE group_id IN
(SELECT id FROM tenure_groups WHERE private = 1 AND alive_until < ?)
