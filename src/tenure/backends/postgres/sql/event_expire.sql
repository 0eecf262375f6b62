-- Events kept longer than the retention, acknowledged or not (their claims
-- go with them): a named group nobody reads does not keep the log growing.
-- Measured on keep_until, so an event with a publisher-given id goes after
-- the retention plus the dedupe window.
DELETE FROM {events} WHERE keep_until < {now}() - %(retention)s * interval '1 second'
