-- Grant KEYS[1] (the lease) to ARGV[1] for ARGV[2] ms, in one atomic step.
-- KEYS[2] is the key's fencing counter (same hash slot).
-- ARGV[3]: quarantine length in ms (0 disables the state-loss check).
-- ARGV[4]: how long an idle counter is kept, in ms.
-- Lease value: "<token>:<owner>" (the token has no ':', the owner may).
-- Returns {1, token} granted, {0, holder} held by another owner,
-- {2, ms} refused for ms more because the server may have lost leases.
local v = redis.call('GET', KEYS[1])
if v then
  local sep = string.find(v, ':', 1, true)
  local holder = string.sub(v, sep + 1)
  if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {1, string.sub(v, 1, sep - 1)}
  end
  return {0, holder}
end
local t = redis.call('TIME')
local last = redis.call('GET', KEYS[2])
local quarantine = tonumber(ARGV[3])
if not last and quarantine > 0 then
  -- No counter: this key was never granted, its counter was cleaned up after a
  -- long idle time, or the server lost its data. A lease granted before the
  -- server started can live until start + max TTL, so refuse until then.
  local info = redis.call('INFO', 'server')
  local uptime = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
  -- TIME - uptime is the start time rounded down to a whole second, so the
  -- real start is at most one second later; add 1% for clock-rate error.
  local until_ms = (tonumber(t[1]) - uptime + 1) * 1000 + quarantine + math.ceil(quarantine / 100)
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now_ms < until_ms then
    return {2, string.format('%.0f', until_ms - now_ms)}
  end
end
-- Tokens are at least the server's time in microseconds, so they keep
-- increasing when the counter is missing (cleaned up, lost in a restart).
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
if last and tonumber(last) >= token then
  token = tonumber(last) + 1
end
local s = string.format('%.0f', token)
redis.call('SET', KEYS[2], s, 'PX', ARGV[4])
redis.call('SET', KEYS[1], s .. ':' .. ARGV[1], 'PX', ARGV[2])
return {1, s}
