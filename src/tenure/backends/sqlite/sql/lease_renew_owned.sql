-- Renew the live leases among a list of (key, owner) pairs, each owner its own;
-- returns the pairs renewed. {rows} is replaced by one (?, ?) per pair.
-- Parameters: new deadline, now, then key and owner of each pair.
UPDATE tenure_leases SET deadline = ?
WHERE deadline > ? AND (key, owner) IN (VALUES {rows})
RETURNING key, owner
