-- Extend KEYS[1] to ARGV[2] ms if ARGV[1] holds it. Returns 1 or 0.
-- Never creates the key, so an expired lease is not resurrected.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local sep = string.find(v, ':', 1, true)
if string.sub(v, sep + 1) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
