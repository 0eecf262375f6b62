-- A re-acquire by the current owner: fresh deadline, same token.
UPDATE tenure_leases SET deadline = ? WHERE key = ?
