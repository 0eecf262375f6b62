-- Rows of expired leases are dead weight (tokens live in tenure_meta).
DELETE FROM tenure_leases WHERE deadline <= ?
