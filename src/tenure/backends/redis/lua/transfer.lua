-- Hand KEYS[1] from ARGV[1] to ARGV[2] with a fresh TTL of ARGV[3] ms and a
-- new fencing token from KEYS[2], in one step: the key is never free.
-- ARGV[4]: how long an idle counter is kept, in ms. ARGV[5], ARGV[6]: the
-- channel and message announcing the change. Returns the new token or false.
-- No quarantine check: a live lease held by ARGV[1] shows that this key's
-- state was not lost.
local v = redis.call('GET', KEYS[1])
if not v then
  return false
end
local sep = string.find(v, ':', 1, true)
if string.sub(v, sep + 1) ~= ARGV[1] then
  return false
end
local t = redis.call('TIME')
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = redis.call('GET', KEYS[2])
if last and tonumber(last) >= token then
  token = tonumber(last) + 1
end
if tonumber(string.sub(v, 1, sep - 1)) >= token then
  token = tonumber(string.sub(v, 1, sep - 1)) + 1
end
local s = string.format('%.0f', token)
redis.call('SET', KEYS[2], s, 'PX', ARGV[4])
redis.call('SET', KEYS[1], s .. ':' .. ARGV[2], 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return s
