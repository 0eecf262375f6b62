-- Settle deliveries of entries ARGV[4..] of group ARGV[1] of stream KEYS[1]
-- that the consumer ARGV[2] still holds. An entry a reclaim (or a hand-back,
-- or another member after claim_idle_ms) has taken away is left to whoever
-- has it now: nothing changes for it.
--   ARGV[3] == 'ack': acknowledge them (a reader's batch of handled entries).
--   ARGV[3] == a number: record one more delivery of the one entry ARGV[4]
--   (that delivery count, idle time reset), so this consumer may hand it to
--   its callback again.
-- Returns how many were settled.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local held = {}
for i = 4, #ARGV do
  if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2]) > 0 then
    held[#held + 1] = ARGV[i]
  end
end
if #held == 0 then
  return 0
end
if ARGV[3] == 'ack' then
  return redis.call('XACK', KEYS[1], ARGV[1], unpack(held))
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, held[1], 'RETRYCOUNT', ARGV[3], 'JUSTID')
return 1
