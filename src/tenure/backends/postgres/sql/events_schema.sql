-- The event log, created at the first use of the event half (publish,
-- subscribe, reclaim, backlog), under the same advisory lock as schema.sql.
-- Statements are separated by lines holding only "--;".
--
-- An event is one row; each consumer group of its topic gets one claim row
-- for it, written by the publishing statement itself. A group's claims are
-- its queue: members take them with FOR UPDATE SKIP LOCKED. (A per-group
-- cursor over the event ids would skip events: identity values are taken
-- before commit, so a smaller id can commit after a larger one was read.)
-- topic and source_id (the publisher's event id, NULL when tenure made one up)
-- are UTF-8 bytes like lease keys. keep_until: an acknowledged event goes
-- once it passed (deduplication keeps an event with a publisher's id for the
-- dedupe window), and every event goes once it is older than the retention
-- (one index serves both prunings).
CREATE TABLE IF NOT EXISTS {events} (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic      bytea       NOT NULL,
    body       text        NOT NULL,
    source_id  bytea,
    stored_at  timestamptz NOT NULL,
    keep_until timestamptz NOT NULL
)
--;
CREATE UNIQUE INDEX IF NOT EXISTS {events_source} ON {events} (topic, source_id)
    WHERE source_id IS NOT NULL
--;
CREATE INDEX IF NOT EXISTS {events_keep} ON {events} (keep_until)
--;
-- A consumer group: a named one is shared by its members in every process; a
-- fan-out subscriber has a private one (a random name), deleted when it
-- unsubscribes, or by anyone once its instance stopped heart-beating.
CREATE TABLE IF NOT EXISTS {groups} (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic       bytea       NOT NULL,
    name        bytea       NOT NULL,
    private     boolean     NOT NULL,
    alive_until timestamptz NOT NULL,
    UNIQUE (topic, name)
)
--;
CREATE INDEX IF NOT EXISTS {groups_alive} ON {groups} (alive_until) WHERE private
--;
-- One event not yet acknowledged by one group. attempt: deliveries so far;
-- visible_at: when a member may take it (again); consumer: the backend
-- instance that took it (NULL: never taken, handed back or reclaimed).
-- No foreign key to the groups: a publish must not fail (or wait) because a
-- fan-out group it saw is being deleted; a claim of a deleted group is
-- pruned instead (claim_prune_orphans.sql).
CREATE TABLE IF NOT EXISTS {claims} (
    group_id   bigint      NOT NULL,
    event_id   bigint      NOT NULL REFERENCES {events} (id) ON DELETE CASCADE,
    attempt    integer     NOT NULL DEFAULT 0,
    visible_at timestamptz NOT NULL DEFAULT '-infinity',
    consumer   uuid,
    PRIMARY KEY (group_id, event_id)
)
--;
CREATE INDEX IF NOT EXISTS {claims_event} ON {claims} (event_id)
