-- Grant KEYS[1] (the lease) to ARGV[1] for ARGV[2] ms, in one atomic step.
-- KEYS[2] is the key's fencing counter (same hash slot), KEYS[3] the prefix's
-- epoch marker (see epoch.lua).
-- ARGV[3]: quarantine length in ms (0 disables the state-loss check).
-- ARGV[4]: how long an idle counter is kept, in ms.
-- ARGV[5]: '1' when the server may evict keys (its eviction count is then
-- compared with the marker's on every new grant).
-- ARGV[6]: '1' on a Redis Cluster, where no new connection runs epoch.lua
-- first: the replication ID is then compared with the marker's here.
-- Lease value: "<token>:<owner>" (the token has no ':', the owner may).
-- Returns {1, token} granted, {0, holder} held by another owner,
-- {2, ms} refused for ms more because the server may have lost leases,
-- {3} the marker is missing or keys were evicted: run epoch.lua, then again.
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
if ARGV[3] ~= '0' then
  -- Only a new grant reads the marker: one GET. "0:…" (no quarantine, the
  -- usual case) needs no parsing unless keys can be evicted or on a cluster.
  local m = redis.call('GET', KEYS[3])
  if not m then
    return {3}
  end
  if string.byte(m, 1) ~= 48 or ARGV[5] == '1' or ARGV[6] == '1' then
    local until_ms, replid, evicted = string.match(m, '^(%d+):([^:]*):(%d+)$')
    if ARGV[6] == '1' then
      if string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)') ~= replid then
        return {3}
      end
    end
    if ARGV[5] == '1' then
      local now_evicted = string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)')
      if tonumber(now_evicted) > tonumber(evicted) then
        return {3}
      end
    end
    local left = tonumber(until_ms) - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    if left > 0 then
      return {2, string.format('%.0f', left)}
    end
    if until_ms ~= '0' then
      -- The quarantine is over: record it, so later grants take the short way.
      redis.call('SET', KEYS[3], '0' .. string.sub(m, #until_ms + 1))
    end
  end
end
-- Tokens are at least the server's time in microseconds, so they keep
-- increasing when the counter is missing (cleaned up, lost in a restart).
local last = redis.call('GET', KEYS[2])
local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
if last and tonumber(last) >= token then
  token = tonumber(last) + 1
end
local s = string.format('%.0f', token)
redis.call('SET', KEYS[2], s, 'PX', ARGV[4])
redis.call('SET', KEYS[1], s .. ':' .. ARGV[1], 'PX', ARGV[2])
return {1, s}
