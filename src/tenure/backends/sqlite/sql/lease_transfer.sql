-- Transfer, after the holder check: the new owner, a new token and deadline, no gap.
-- Parameters: to_owner, token, deadline, key.
UPDATE tenure_leases SET owner = ?, token = ?, deadline = ? WHERE key = ?
