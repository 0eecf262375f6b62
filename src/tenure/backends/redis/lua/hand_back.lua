-- Hand a leaving member's unacknowledged entries of stream KEYS[1] back to its
-- group, in one atomic step: each is moved to the placeholder consumer ARGV[3]
-- with an idle time of ARGV[4] ms (so every member's next reclaim takes it at
-- once) and its delivery count lowered by one (the delivery that nobody
-- finished is not counted, as on the other backends); then the member ARGV[2]
-- of group ARGV[1] is deleted. Walks the member's pending list by id, so it
-- ends even if an entry cannot move. Returns how many entries were handed back.
local start, moved = '-', 0
while true do
  local pending = redis.call('XPENDING', KEYS[1], ARGV[1], start, '+', 100, ARGV[2])
  if #pending == 0 then
    break
  end
  for _, entry in ipairs(pending) do
    local count = tonumber(entry[4]) - 1
    if count < 0 then
      count = 0
    end
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, entry[1],
               'IDLE', ARGV[4], 'RETRYCOUNT', count, 'JUSTID')
    moved = moved + 1
    start = '(' .. entry[1]
  end
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
-- Retention (ARGV[5] ms, '0': off): a stream that every group has read and
-- acknowledged in full, and that no member reads any more, expires after it
-- unless a publish or a subscribe (which PERSIST it) comes first.
if ARGV[5] == '0' then
  return moved
end
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for i = 1, #group, 2 do
    info[group[i]] = group[i + 1]
  end
  if info['pending'] > 0 or info['lag'] ~= 0 then
    return moved
  end
  for _, member in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], info['name'])) do
    for i = 1, #member, 2 do
      if member[i] == 'name' and member[i + 1] ~= ARGV[3] then
        return moved
      end
    end
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return moved
