-- Join a consumer group, creating it if needed; its id. A new group gets the
-- events published after it committed.
INSERT INTO {groups} AS g (topic, name, private, alive_until)
VALUES (%(topic)s, %(name)s, %(private)s, {now}() + %(alive)s * interval '1 second')
ON CONFLICT (topic, name) DO UPDATE SET alive_until = greatest(g.alive_until, excluded.alive_until)
RETURNING g.id
