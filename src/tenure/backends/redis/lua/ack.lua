-- Acknowledge entry ARGV[2] of group ARGV[1] of stream KEYS[1] if the consumer
-- ARGV[3] still holds it. An entry a reclaim (or a hand-back, or another
-- member after claim_idle_ms) has taken away is left to whoever has it now.
-- Returns 1 if acknowledged, else 0.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local held = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1, ARGV[3])
if #held == 0 then
  return 0
end
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
