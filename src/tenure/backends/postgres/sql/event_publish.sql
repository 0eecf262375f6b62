-- publish: store an event and one claim per consumer group of its topic, in
-- one statement, and wake the listeners. Nothing is stored when the topic has
-- no group (nobody would read it), nor when an event with the same
-- publisher-given id is kept for the topic (the unique index makes that check
-- atomic, also between concurrent publishes).
-- The notification is sent only when some group of the topic had no claim
-- waiting to be taken for the first time: otherwise the publish that stored
-- that claim notified, and its members take this one with it (a member takes
-- again after every take that found something). PostgreSQL serialises the
-- commits of notifying transactions, so a busy topic notifies rarely.
-- Result: the new event's id (NULL: not stored), and the kept event's body
-- when one with this source id was already there.
WITH e AS (
    INSERT INTO {events} (topic, body, source_id, stored_at, keep_until)
    SELECT %(topic)s, %(body)s, %(source)s, c.now, c.now + %(keep)s * interval '1 second'
    FROM (SELECT {now}() AS now) AS c
    WHERE EXISTS (SELECT 1 FROM {groups} WHERE topic = %(topic)s)
    ON CONFLICT (topic, source_id) WHERE source_id IS NOT NULL DO NOTHING
    RETURNING id
), claims AS (
    INSERT INTO {claims} (group_id, event_id)
    SELECT g.id, e.id FROM e, {groups} AS g WHERE g.topic = %(topic)s
)
SELECT (SELECT id FROM e),
       (SELECT body FROM {events} WHERE topic = %(topic)s AND source_id = %(source)s),
       (SELECT count(pg_catalog.pg_notify(%(channel)s, encode(%(topic)s, 'hex'))) FROM e
        WHERE EXISTS (SELECT 1 FROM {groups} AS g
                      WHERE g.topic = %(topic)s
                        AND NOT EXISTS (SELECT 1 FROM {claims} AS c
                                        WHERE c.group_id = g.id AND c.consumer IS NULL
                                          AND c.visible_at = '-infinity')))
