-- Publish the event ARGV[1] (JSON) on stream KEYS[1], trimmed to about
-- ARGV[2] entries, and note the topic ARGV[3] in the backlog index
-- ARGV[4] .. <group> of each named group ("g:…") of the stream. Named groups
-- are the only ones BACKLOG asks about; private fan-out groups are skipped.
--
-- With a second key KEYS[2] (the guard of the caller-given event id, in the
-- stream's hash slot): if the guard exists the id was already published
-- within the dedupe window, so nothing is stored and {0, <first event JSON>}
-- is returned; otherwise the guard is set to the event for ARGV[5] ms.
-- Returns {1, <stream entry id>} when the event was stored. ARGV[6]: the
-- backend's retention_ms ('0': streams are kept).
--
-- The index keys are not declared (they are not in the stream's slot): fine on
-- one Redis; on a Redis Cluster ARGV[4] is empty and no index is kept.
if #KEYS == 2 then
  local first = redis.call('GET', KEYS[2])
  if first then
    return {0, first}
  end
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'e', ARGV[1])
-- A stream left to expire (drained, read by no one: see hand_back.lua) holds
-- an unread event now: it stays until someone reads it.
if ARGV[6] ~= '0' then
  redis.call('PERSIST', KEYS[1])
end
if #KEYS == 2 then
  redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[5])
end
if ARGV[4] == '' then
  return {1, id}
end
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  for i = 1, #group, 2 do
    if group[i] == 'name' then
      local name = group[i + 1]
      if string.sub(name, 1, 2) == 'g:' then
        redis.call('SADD', ARGV[4] .. name, ARGV[3])
      end
      break
    end
  end
end
return {1, id}
