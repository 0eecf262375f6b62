-- Private groups whose instance stopped heart-beating. Parameter: now.
DELETE FROM tenure_groups WHERE private = 1 AND alive_until < ?
