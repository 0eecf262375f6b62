-- Delete KEYS[1] if ARGV[1] holds it, then announce it: PUBLISH ARGV[3] to
-- channel ARGV[2] (the user key), which wakes a waiter. Returns 1 or 0.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local sep = string.find(v, ':', 1, true)
if string.sub(v, sep + 1) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
