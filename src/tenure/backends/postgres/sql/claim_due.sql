-- The groups among ids with a claim that a member may take now (never taken,
-- handed back, reclaimed, or past its visibility timeout): the fallback poll
-- asks this once for all of an instance's groups rather than taking in each,
-- so an idle group costs nothing. Claims held by a live member are not due.
SELECT DISTINCT group_id FROM {claims}
WHERE group_id = ANY(%(ids)s::bigint[]) AND visible_at <= {now}()
