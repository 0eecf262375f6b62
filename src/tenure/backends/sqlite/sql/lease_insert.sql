-- A grant: a new owner and token (replaces an expired row).
INSERT OR REPLACE INTO tenure_leases (key, owner, token, deadline) VALUES (?, ?, ?, ?)
