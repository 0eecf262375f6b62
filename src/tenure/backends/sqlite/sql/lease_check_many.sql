-- Change detection: the lease rows of the keys this instance waits on.
-- {keys} is replaced by one ? per key.
SELECT key, token, deadline FROM tenure_leases WHERE key IN ({keys})
