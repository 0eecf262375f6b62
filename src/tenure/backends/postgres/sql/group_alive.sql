-- Heartbeat of the groups this instance serves; returns those that still exist
-- (a missing one was deleted as dead by another instance).
UPDATE {groups} SET alive_until = greatest(alive_until, {now}() + %(alive)s * interval '1 second')
WHERE id = ANY(%(ids)s::bigint[])
RETURNING id
