-- The next fencing token, bumped in the transaction that grants the lease.
UPDATE tenure_meta SET value = value + 1 WHERE name = 'token' RETURNING value
