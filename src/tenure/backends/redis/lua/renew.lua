-- Extend KEYS[1] to ARGV[2] ms if ARGV[1] holds it. Returns 1 or 0.
-- Never creates the key, so an expired lease is not resurrected.
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, string.find(v, ':', 1, true) + 1) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
