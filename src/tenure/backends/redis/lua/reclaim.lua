-- Give every entry of group ARGV[1] of stream KEYS[1] that a member was
-- delivered and did not acknowledge back to the group, in one atomic step:
-- each moves to the placeholder consumer ARGV[2] with an idle time of ARGV[3]
-- ms, so any member's next look takes it at once (in id order, before it
-- reads newer entries). The delivery count is kept: the member that takes it
-- counts one more delivery. Entries already with ARGV[2] stay as they are.
-- Walks the group's pending list by id. Returns how many entries moved.
-- A missing stream or group raises NOGROUP (the caller answers 0).
local start, moved = '-', 0
while true do
  local pending = redis.call('XPENDING', KEYS[1], ARGV[1], start, '+', 100)
  if #pending == 0 then
    break
  end
  for _, entry in ipairs(pending) do
    if entry[2] ~= ARGV[2] then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, entry[1],
                 'IDLE', ARGV[3], 'RETRYCOUNT', entry[4], 'JUSTID')
      moved = moved + 1
    end
    start = '(' .. entry[1]
  end
end
return moved
