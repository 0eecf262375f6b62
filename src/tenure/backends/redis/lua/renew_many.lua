-- renew.lua for many leases at once, each with its own owner: extend KEYS[i]
-- to ARGV[1] ms if ARGV[i + 1] holds it. Returns one 1 or 0 per key, in order.
-- Never creates a key, so an expired lease is not resurrected. The keys may
-- be in any slots: only for a server that is not a cluster.
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v and string.sub(v, string.find(v, ':', 1, true) + 1) == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
