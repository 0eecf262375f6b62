-- The tables, created by the first connection to a file (idempotent).
-- tenure_meta holds the fencing-token counter: it survives the deletion of
-- expired or released lease rows, so tokens strictly increase for every key.
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS tenure_meta (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO tenure_meta (name, value) VALUES ('token', 0);
CREATE TABLE IF NOT EXISTS tenure_leases (
    key BLOB PRIMARY KEY,
    owner BLOB NOT NULL,
    token INTEGER NOT NULL,
    deadline REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tenure_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic BLOB NOT NULL,
    body TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS tenure_events_topic ON tenure_events (topic, id);
CREATE TABLE IF NOT EXISTS tenure_groups (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic BLOB NOT NULL,
    name BLOB NOT NULL,
    cursor INTEGER NOT NULL,
    private INTEGER NOT NULL,
    alive_until REAL NOT NULL,
    UNIQUE (topic, name)
);
CREATE TABLE IF NOT EXISTS tenure_pending (
    group_id INTEGER NOT NULL,
    event_id INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    visible_at REAL NOT NULL,
    consumer TEXT,
    PRIMARY KEY (group_id, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tenure_pending_event ON tenure_pending (event_id);
COMMIT;
