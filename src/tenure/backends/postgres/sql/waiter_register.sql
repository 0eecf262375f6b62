-- wait_lease_released, before it reads the lease: note that this backend
-- instance waits for the key until its wait times out. Committed before the
-- read, so a release that the read does not see sees this row and notifies.
-- A few expired rows of other keys are removed on the way (SKIP LOCKED: never
-- waits for another session), so rows of dead processes do not pile up.
WITH stale AS (
    DELETE FROM {waiters} WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM {waiters}
        WHERE until < {now}() AND key <> %(key)s
        LIMIT 16 FOR UPDATE SKIP LOCKED))
)
INSERT INTO {waiters} AS w (key, waiter, until)
VALUES (%(key)s, %(waiter)s, {now}() + %(seconds)s * interval '1 second')
ON CONFLICT (key, waiter) DO UPDATE SET until = greatest(w.until, excluded.until)
