-- Settle one delivery of entry ARGV[2] of group ARGV[1] of stream KEYS[1], if
-- the consumer ARGV[3] still holds it. An entry a reclaim (or a hand-back, or
-- another member after claim_idle_ms) has taken away is left to whoever has it
-- now: returns 0 and changes nothing.
--   ARGV[4] == 'ack': acknowledge it.
--   ARGV[4] == a number: record one more delivery (that delivery count, idle
--   time reset), so this consumer may hand it to its callback again.
-- Returns 1 when settled.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1, ARGV[3])
if #held == 0 then
  return 0
end
if ARGV[4] == 'ack' then
  return redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[2], 'RETRYCOUNT', ARGV[4], 'JUSTID')
return 1
