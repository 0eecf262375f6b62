-- Events no group still has a claim on, once kept long enough (an event with
-- a publisher-given id stays for the dedupe window). Most go already when
-- their last claim is acknowledged (claim_settle.sql).
DELETE FROM {events} AS e
WHERE e.keep_until < {now}()
  AND NOT EXISTS (SELECT 1 FROM {claims} AS c WHERE c.event_id = e.id)
