-- Record one more delivery of entry ARGV[2] of group ARGV[1] of stream
-- KEYS[1] (delivery count ARGV[4], idle time reset) if the consumer ARGV[3]
-- still holds it, so that consumer may hand it to its callback again. Returns
-- 1 if so, 0 if it was taken away (by a reclaim, a hand-back, or another
-- member after claim_idle_ms): whoever has it now delivers it.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1, ARGV[3])
if #held == 0 then
  return 0
end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[2], 'RETRYCOUNT', ARGV[4], 'JUSTID')
return 1
