-- Thread output streams (tenure.runtime replies), created on first use under
-- the DDL lock. Positions are 1, 2, 3, ... per stream without gaps: the newest
-- row is never pruned, so the next position is always max(pos) + 1.
CREATE TABLE IF NOT EXISTS {output} (
    stream bytea       NOT NULL,
    pos    bigint      NOT NULL,
    body   text        NOT NULL,
    at     timestamptz NOT NULL,
    PRIMARY KEY (stream, pos)
)
