-- Registrations of waits that have timed out.
DELETE FROM {waiters} WHERE until < {now}()
