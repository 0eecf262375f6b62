-- Lease rows whose deadline passed more than the retention (lease_retention
-- seconds) ago: released (owner NULL) or expired. A lease whose deadline is
-- ahead of the server clock is never deleted; an acquire racing this delete
-- either takes the row first (its new deadline makes the delete, re-checking
-- the row, skip it) or waits and inserts the key anew.
-- Only a row whose token is below the cut in microseconds: a new row's token
-- is the server time in microseconds (acquire.sql), so the key's next token is
-- still higher than any it had, unless the server clock goes back by more than
-- the retention. (A key granted more than once per microsecond, or under a
-- frozen test clock, can have tokens ahead of the clock: such a row is kept.)
DELETE FROM {table} AS t
USING (SELECT {now}() - %(retention)s * interval '1 second' AS cut) AS c
WHERE t.deadline < c.cut
  AND t.token < (extract(epoch FROM c.cut) * 1000000)::bigint
