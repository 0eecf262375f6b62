-- Revoke the live lease KEYS[1] whoever holds it; when ARGV[1] is not empty,
-- only if its token is ARGV[1]. Then announce it as a release does: PUBLISH
-- ARGV[3] to channel ARGV[2]. Returns 1 or 0. The counter key is untouched,
-- so the next grant's token is higher.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
if ARGV[1] ~= '' then
  local sep = string.find(v, ':', 1, true)
  if string.sub(v, 1, sep - 1) ~= ARGV[1] then
    return 0
  end
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
