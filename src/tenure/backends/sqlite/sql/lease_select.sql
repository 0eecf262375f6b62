-- The lease row of a key (live or expired): acquire and transfer decide in Python.
SELECT owner, token, deadline FROM tenure_leases WHERE key = ?
