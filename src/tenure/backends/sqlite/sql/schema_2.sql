-- Migration 2: live leases readable with plain SQL (sqlite3 tenure.db
-- 'SELECT * FROM tenure_leases_live'). Keys and owners are stored as the
-- UTF-8 bytes of their text (BLOB: any text round-trips, NUL included); the
-- view shows them as text, the deadline as a UTC time and the TTL left. It
-- reads the wall clock, which is the backend's clock unless one was injected.
CREATE VIEW IF NOT EXISTS tenure_leases_live AS
SELECT CAST(key AS TEXT) AS key,
       CAST(owner AS TEXT) AS owner,
       token,
       strftime('%Y-%m-%dT%H:%M:%fZ', deadline, 'unixepoch') AS expires_at,
       CAST(round((deadline - (julianday('now') - 2440587.5) * 86400.0) * 1000) AS INTEGER)
           AS ttl_ms
FROM tenure_leases
WHERE deadline > (julianday('now') - 2440587.5) * 86400.0;
PRAGMA user_version = 2;
