-- The live lease KEYS[1] and its remaining TTL in ms, read in one step.
-- Returns {value, pttl} or false.
local v = redis.call('GET', KEYS[1])
if not v then
  return false
end
return {v, redis.call('PTTL', KEYS[1])}
