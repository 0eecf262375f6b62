-- Renew: the holder check (owner matches, lease live) and the change in one statement.
-- Parameters: new deadline, key, owner, now.
UPDATE tenure_leases SET deadline = ? WHERE key = ? AND owner = ? AND deadline > ?
