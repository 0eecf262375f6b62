-- Revoke: delete the live lease of a key, whoever holds it, if its token is
-- the given one (or any token when NULL). The token counter is untouched, so
-- the next grant's token is higher. Parameters: key, now, token, token.
DELETE FROM tenure_leases WHERE key = ? AND deadline > ? AND (? IS NULL OR token = ?)
