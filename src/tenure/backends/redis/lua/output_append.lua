-- Append ARGV[5..] to the thread output stream KEYS[2] if the lease KEYS[1]
-- is held by ARGV[1] with token ARGV[2]: the fence and the XADDs are one step.
-- Entries are "0-<position>" (XADD 0-*): positions 1, 2, 3, ... without gaps,
-- and trimming never resets them (the stream keeps its last id).
-- ARGV[3]: at most this many entries kept; ARGV[4]: none older than this many ms
-- (the newest is always kept).
-- Returns the last position, or -1 (nothing stored: fenced).
local v = redis.call('GET', KEYS[1])
if not v then
  return -1
end
local sep = string.find(v, ':', 1, true)
if string.sub(v, 1, sep - 1) ~= ARGV[2] or string.sub(v, sep + 1) ~= ARGV[1] then
  return -1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id
for i = 5, #ARGV do
  id = redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[3], '0-*', 'at', now, 'b', ARGV[i])
end
local cut = now - tonumber(ARGV[4])
-- Age: the oldest entries first, one at a time (usually one XRANGE that finds
-- nothing to drop), never the newest.
while true do
  local oldest = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)[1]
  if oldest[1] == id or tonumber(oldest[2][2]) >= cut then
    break
  end
  redis.call('XDEL', KEYS[2], oldest[1])
end
return tonumber(string.sub(id, 3))
