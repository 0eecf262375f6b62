-- Heartbeat of the groups this instance uses. {keys} is replaced by one ? per
-- group id. Parameters: alive_until, group ids.
UPDATE tenure_groups SET alive_until = ? WHERE id IN ({keys})
