-- Release: the holder check (owner matches, lease live) and the delete in one statement.
-- Parameters: key, owner, now.
DELETE FROM tenure_leases WHERE key = ? AND owner = ? AND deadline > ?
