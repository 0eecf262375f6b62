-- Events older than the retention, acknowledged or not (their claims go with
-- them): a named group nobody reads does not keep the log growing.
DELETE FROM {events} WHERE stored_at < {now}() - %(retention)s * interval '1 second'
