-- Renew the caller's live leases among a list of keys; returns the keys renewed.
-- {keys} is replaced by one ? per key. Parameters: new deadline, owner, now, keys.
UPDATE tenure_leases SET deadline = ?
WHERE owner = ? AND deadline > ? AND key IN ({keys})
RETURNING key
