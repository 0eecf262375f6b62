-- Thread output streams (tenure.runtime replies), created on first use.
-- Positions are 1, 2, 3, ... per stream without gaps: the newest row is never
-- pruned, so the next position is always max(pos) + 1.
CREATE TABLE IF NOT EXISTS tenure_output (
    stream BLOB NOT NULL,
    pos INTEGER NOT NULL,
    body TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (stream, pos)
) WITHOUT ROWID
