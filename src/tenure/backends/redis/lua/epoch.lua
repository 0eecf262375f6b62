-- Decide whether this server may have lost leases of the prefix whose epoch
-- marker is KEYS[1], and record the answer in the marker, in one atomic step.
-- KEYS[2]: the server-wide flush record, "<flushes counted>:<ms first seen>":
-- when a tenure client first saw the server's current count of FLUSHALL and
-- FLUSHDB calls (in database 0, ARGV[4] being the client's database; on a
-- cluster, ARGV[4] is '' and the record is in KEYS[1]'s slot). Without KEYS[2]
-- every flush counts as seen now.
-- ARGV[1]: quarantine length in ms (the prefix's max TTL).
-- ARGV[2]: '1' when the server's persistence keeps every write across a
-- restart (appendonly yes, appendfsync always), as read by the client.
-- ARGV[3]: '1' when this client has seen the marker before (a grant of the
-- prefix went through it): its absence then proves that state was lost.
--
-- The marker is "<end of quarantine, ms>:<master_replid>:<evicted_keys>". Every
-- grant needs it (acquire.lua answers {3} without it), so while any lease of
-- the prefix is live the marker exists. Lease state may have been lost when:
--   * the marker is missing and the client saw it before, or the server shows
--     a way it could have lost it: it was promoted from a replica (a replica
--     promoted before the prefix's first grant reached it has no marker, yet
--     that grant can be in use), it started less than a quarantine ago without
--     durable persistence, its clock is behind its start time, FLUSHALL/FLUSHDB
--     ran less than a quarantine before the first time any tenure client saw
--     that it had run (the flush record), or it evicted keys;
--   * the marker's replication ID is not the server's: a replica was
--     promoted, or the server restarted from a snapshot or a log without
--     appendfsync always (its data may be older than the grants clients saw);
--   * the server evicted keys since the marker was written.
-- Then new grants are refused until a lease granted before the loss has
-- expired: for ARGV[1] ms (+1%, clock-rate error) from now, or from the
-- server's start after a restart. A missing marker with none of those signs
-- means this prefix was never used on this server (see Quarantine in _quarantine.py
-- for what that cannot rule out).
-- Returns {ms left in the quarantine (0 if none), reason ('' if none)}.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local q = tonumber(ARGV[1])
local function field(section, name)
  return string.match(redis.call('INFO', section), name .. ':([%-%w]+)')
end
local replid = field('replication', 'master_replid') or ''
local evicted = tonumber(field('stats', 'evicted_keys'))
local until_ms = now_ms + q + math.ceil(q / 100)
local reason

-- The server time at which the current count of flushes was first seen: every
-- flush counted happened before it. Now when this is the first sight (the
-- record is written), or when the record cannot be read (an ACL, say).
local function flush_seen_ms(count)
  if not KEYS[2] then
    return now_ms
  end
  if ARGV[4] ~= '' then
    local selected = redis.pcall('SELECT', 0)
    if type(selected) == 'table' and selected.err then
      return now_ms
    end
  end
  local seen = now_ms
  local record = redis.pcall('GET', KEYS[2])
  if type(record) == 'string' then
    local seen_count, seen_at = string.match(record, '^(%d+):(%d+)$')
    if seen_count == count then
      seen = tonumber(seen_at)
    end
  end
  if seen == now_ms then
    redis.pcall('SET', KEYS[2], string.format('%s:%.0f', count, now_ms))
  end
  if ARGV[4] ~= '' then
    redis.call('SELECT', tonumber(ARGV[4]))
  end
  return seen
end

local m = redis.call('GET', KEYS[1])
if m then
  local old_until, old_id, old_evicted = string.match(m, '^(%d+):([^:]*):(%d+)$')
  if old_id ~= replid then
    -- master_replid2 is the ID a promoted replica had before; all zeros on a
    -- server that was never promoted since it started (its data is what it
    -- loaded from its own disk: all of it with appendfsync always).
    local replid2 = field('replication', 'master_replid2') or ''
    if ARGV[2] ~= '1' or string.find(replid2, '[^0]') then
      reason = 'its replication ID changed: a replica was promoted, or it restarted'
        .. ' from a snapshot or a log that may miss the last writes'
    end
  elseif evicted > tonumber(old_evicted) then
    reason = 'it evicted keys'
  elseif evicted < tonumber(old_evicted) then
    reason = 'its statistics were reset (CONFIG RESETSTAT): evictions cannot be ruled out'
  end
  if not reason then
    if old_id == replid then
      local left = tonumber(old_until) - now_ms
      return {left > 0 and left or 0, ''}  -- nothing changed: no write
    end
    until_ms = tonumber(old_until)
  end
else
  local uptime = tonumber(field('server', 'uptime_in_seconds'))
  local flushes = 0
  for calls in string.gmatch(redis.call('INFO', 'commandstats'), 'cmdstat_flush[a-z]+:calls=(%d+)') do
    flushes = flushes + tonumber(calls)
  end
  local flush_until = 0
  if flushes > 0 then
    flush_until = flush_seen_ms(string.format('%d', flushes)) + q + math.ceil(q / 100)
  end
  -- master_replid2 is all zeros unless the server was promoted from a replica
  -- (then it is the ID of the primary it followed).
  local replid2 = field('replication', 'master_replid2') or ''
  if ARGV[3] == '1' then
    reason = 'the epoch marker this client saw there is gone'
  elseif string.find(replid2, '[^0]') then
    reason = 'it was promoted from a replica and has no epoch marker: the first grant'
      .. ' of the prefix may not have reached it'
  elseif uptime < 0 then
    reason = 'its clock is behind the time it started'
  else
    -- A young server and a recent flush both end in a known time: the later
    -- end counts (a server just started can also have been flushed since).
    local young_until = 0
    if ARGV[2] ~= '1' and uptime * 1000 < q + 1000 + math.ceil(q / 100) then
      reason = string.format('it started %d s ago without appendfsync always', uptime)
      -- TIME - uptime is the start rounded down to a whole second.
      young_until = (tonumber(t[1]) - uptime + 1) * 1000 + q + math.ceil(q / 100)
      until_ms = young_until
    end
    if flush_until > now_ms and flush_until > young_until then
      -- A lease granted before the flush is live at most q after it, and the
      -- flush came before it was first seen.
      reason = 'FLUSHALL or FLUSHDB ran since it started, less than max_ttl_ms before'
        .. ' a tenure client first saw it'
      until_ms = flush_until
    end
    if not reason then
      if evicted > 0 then
        reason = 'it evicted keys'
      else
        until_ms = 0
      end
    end
  end
end
redis.call('SET', KEYS[1], string.format('%.0f:%s:%d', until_ms, replid, evicted))
local left = until_ms - now_ms
return {left > 0 and left or 0, reason or ''}
