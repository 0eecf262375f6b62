-- End a fan-out subscription: destroy its private group ARGV[1] of stream KEYS[1].
-- Retention (ARGV[2] ms, '0': off): a stream no group reads any more expires after
-- it unless a publish or a subscribe (which PERSIST it) comes first. Returns 1 if
-- the group was there.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local destroyed = redis.call('XGROUP', 'DESTROY', KEYS[1], ARGV[1])
if ARGV[2] ~= '0' and #redis.call('XINFO', 'GROUPS', KEYS[1]) == 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return destroyed
