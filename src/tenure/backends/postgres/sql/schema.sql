-- First-use set-up, run in one transaction holding a transaction-scoped
-- advisory lock, and only when a table or the clock function is missing
-- (the function is created only when it is missing, so a replaced clock
-- survives).
-- {schema} and the table names are identifiers composed by psycopg.sql, never pasted.
-- Statements are separated by lines holding only "--;".
CREATE SCHEMA IF NOT EXISTS {schema}
--;
-- key and owner are UTF-8 bytes: bytea holds NUL (text cannot) and compares
-- byte-wise whatever the database collation. A free key keeps its row with
-- owner NULL, so its token keeps increasing across release and expiry.
CREATE TABLE IF NOT EXISTS {table} (
    key      bytea       PRIMARY KEY,
    owner    bytea,
    token    bigint      NOT NULL,
    deadline timestamptz NOT NULL
)
--;
-- Who waits for a release (wait_lease_released): one row per key and waiting
-- backend instance, until the longest of its waits times out. Release and
-- transfer notify only when a live row exists, so a release nobody waits for
-- costs no NOTIFY (whose commit PostgreSQL serialises).
CREATE TABLE IF NOT EXISTS {waiters} (
    key    bytea       NOT NULL,
    waiter uuid        NOT NULL,
    until  timestamptz NOT NULL,
    PRIMARY KEY (key, waiter)
)
--;
-- Live leases readable with plain SQL (SELECT * FROM <schema>.<table>_live).
-- Keys and owners are stored as bytea (text cannot hold NUL); here they are
-- text, escaped only when they hold a NUL. It reads the real clock.
CREATE OR REPLACE VIEW {live} AS
SELECT CASE WHEN position('\x00'::bytea IN t.key) = 0 THEN convert_from(t.key, 'UTF8')
            ELSE encode(t.key, 'escape') END AS key,
       CASE WHEN position('\x00'::bytea IN t.owner) = 0 THEN convert_from(t.owner, 'UTF8')
            ELSE encode(t.owner, 'escape') END AS owner,
       t.token,
       t.deadline AS expires_at,
       ceil(extract(epoch FROM t.deadline - pg_catalog.clock_timestamp()) * 1000)::bigint AS ttl_ms
FROM {table} AS t
WHERE t.owner IS NOT NULL AND t.deadline > pg_catalog.clock_timestamp()
--;
-- The one clock every statement reads. clock_timestamp() is the real time of
-- the call; now() would be the start of the transaction. Tests replace this
-- function (CREATE OR REPLACE) in a schema of their own to control time.
-- Keep it the last statement of this file.
CREATE FUNCTION {now}() RETURNS timestamptz
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS 'SELECT pg_catalog.clock_timestamp()'
