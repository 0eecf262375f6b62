-- Private groups whose instance stopped heart-beating (it died), and their claims.
WITH dead AS (DELETE FROM {groups} WHERE private AND alive_until < {now}() RETURNING id)
DELETE FROM {claims} WHERE group_id IN (SELECT id FROM dead)
