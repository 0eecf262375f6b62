-- Create group ARGV[1] of stream KEYS[1] at its end (the stream made if missing),
-- and take away any expiry retention gave the stream, in one step: a stream with a
-- reader never expires (see fanout_end.lua and hand_back.lua). A group that exists
-- already is kept as it is. Returns 1 if the group was created.
redis.call('PERSIST', KEYS[1])
local made = redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[1], '$', 'MKSTREAM')
if type(made) == 'table' and made.err then
  if string.find(made.err, 'BUSYGROUP') then
    return 0
  end
  return redis.error_reply(made.err)
end
return 1
